"""The kit works without network: no generated page refers to anything outside the kit's folder.

`external_urls(text)` finds every http(s) or protocol-relative URL in a page except the targets of
`<a href>` links (a link is followed by a reader, never fetched by the page; chapters may cite
their sources). `strip_css_comments` drops the comments of inlined style sheets (JupyterLab's
theme CSS credits its sources with URLs in comments). The kit cleans every page it writes and
refuses one that still names an external URL (`check_page`); the browser test also cuts the
network and records every request a page makes.
"""
from __future__ import annotations

import re

_URL = re.compile(r"(?:https?:)?//[A-Za-z0-9][A-Za-z0-9.-]*\.[A-Za-z]{2,}[^\s\"'<>)]*")
_ANCHOR = re.compile(r"<a\s[^>]*?href\s*=\s*(\"[^\"]*\"|'[^']*'|[^\s>]+)", re.I)
_STYLE = re.compile(r"(<style[^>]*>)(.*?)(</style>)", re.S | re.I)
_CSS_COMMENT = re.compile(r"/\*.*?\*/", re.S)


def strip_css_comments(page: str) -> str:
    return _STYLE.sub(lambda m: m.group(1) + _CSS_COMMENT.sub("", m.group(2)) + m.group(3), page)


def external_urls(page: str) -> list[str]:
    """Every external URL in `page` but the targets of <a href> links."""
    without_links = _ANCHOR.sub("<a ", page)
    found = []
    for m in _URL.finditer(without_links):
        url = m.group(0)
        before = without_links[max(0, m.start() - 1):m.start()]
        if url.startswith("//") and before in (":", "/"):     # part of a longer token (e.g. a regex), not a URL
            continue
        if not url.startswith(("http", "//")):
            continue
        found.append(url)
    return found


class ExternalURL(RuntimeError):
    pass


def check_page(page: str, name: str) -> str:
    """`page` with its CSS comments dropped; raises ExternalURL naming the first external URL left."""
    page = strip_css_comments(page)
    urls = external_urls(page)
    if urls:
        raise ExternalURL(f"{name} refers to {len(urls)} external URL(s), e.g. {urls[0]!r}: the kit must work offline")
    return page
