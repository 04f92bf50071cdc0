"""`nwor-lab workshop build|clean` (also `python -m nwor_lab.workshop build|clean`).

Every argument is checked before the first chapter runs (`nwor_lab.commandline.args`: a timeout is a
finite number of seconds > 0, `--out` a folder we can write, the kernel installed, the chapters
found), errors take the `nwor-lab` command's one error path (`nwor_lab.commandline.errors.run`).
"""
from __future__ import annotations

import argparse
import sys
import time

from nwor_lab.commandline import args as types
from nwor_lab.commandline.errors import LabArgumentParser, UsageError, run
from nwor_lab.workshop import kit


def _check_kernels(chapters, kernel: str | None) -> None:
    """An explicit --kernel must exist (it would fail every chapter alike). A chapter's own kernel
    may be missing: the kit lists that chapter as skipped, saying why (or fails it with --strict)."""
    if kernel is None:
        return
    from nwor_lab.sweep.plan import check_kernel
    try:
        check_kernel(chapters[0], kernel)
    except ValueError as err:
        raise UsageError(str(err)) from None


def _check_environment() -> None:
    from nwor_lab.config import LabConfig
    try:
        LabConfig.from_env()        # every chapter's kernel inherits NWOR_LAB_*: refuse a bad one now
    except ValueError as err:
        raise UsageError(f"environment: {err}") from None


def _build(args) -> int:
    chapters = kit.find_chapters(args.chapters)
    if not chapters:
        raise UsageError(f"--chapters {args.chapters!r}: no chapters match; give a glob, a folder or an .ipynb")
    _check_environment()
    _check_kernels(chapters, args.kernel)
    start = time.perf_counter()
    built = kit.build(chapters, args.out, timeout=args.timeout, kernel_name=args.kernel, strict=args.strict)
    failed = [b for b in built if b.status == "failed"]
    skipped = [b for b in built if b.status == "skipped"]
    print(f"workshop kit: {args.out}/index.html ({len(built)} chapters, {len(failed)} failed, {len(skipped)} skipped; "
          f"{time.perf_counter() - start:.0f} s)")
    for b in skipped:
        print(f"workshop kit: {b.name} skipped: {b.error} (--strict fails the build instead)")
    return 1 if failed else 0


def _clean(args) -> int:
    import nbformat

    from nwor_lab.workshop import chapters as ch

    code = 0
    for path in args.notebooks:
        try:
            nb = ch.execute(path, timeout=args.timeout, kernel_name=args.kernel) if args.execute else ch.read(path)
        except Exception as err:
            print(f"workshop clean: {path} failed to run, left as it was: {kit.error_text(err)}", file=sys.stderr)
            code = 1
            continue
        from nwor_lab import atomic
        text = nbformat.writes(ch.clean(nb))
        atomic.write_text(path, text if text.endswith("\n") else text + "\n")
        left = ch.problems(path)
        print(f"workshop clean: {path}" + (f" still has problems: {'; '.join(left)}" if left else " clean"))
        code = code or (1 if left else 0)
    return code


def _add_commands(sub) -> None:
    b = sub.add_parser("build", help="execute every chapter (interactive=False); pages, slides, instructor notes, agenda: index.html",
                       description=kit.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("--out", type=types.output_folder, default=kit.DEFAULT_OUT, help="kit folder (default: %(default)s)")
    b.add_argument("--chapters", default=kit.DEFAULT_CHAPTERS, help="glob, folder or file (default: %(default)s)")
    b.add_argument("--timeout", type=types.seconds, default=kit.DEFAULT_TIMEOUT,
                   help="seconds any one cell may run before its chapter fails (default: %(default)s)")
    b.add_argument("--kernel", default=None, help="kernel name (default: the notebook's own, python3)")
    b.add_argument("--strict", action="store_true",
                   help="a chapter that cannot run here (its kernel is not installed) fails the build "
                        "(default: it is listed as skipped, with the reason)")
    b.set_defaults(func=_build)
    c = sub.add_parser("clean", help="make chapters committable: drop outputs (but NBVAL_CHECK_OUTPUT cells'), "
                                     "execution counts, widget state (in place)")
    c.add_argument("notebooks", nargs="+", type=types.existing_file)
    c.add_argument("--execute", action="store_true",
                   help="run each notebook first (as committed), so checked cells store fresh expected output")
    c.add_argument("--timeout", type=types.seconds, default=kit.DEFAULT_TIMEOUT, help="seconds any one cell may run")
    c.add_argument("--kernel", default=None, help="kernel name (default: the notebook's own, python3)")
    c.set_defaults(func=_clean)


def add_parsers(subparsers) -> None:
    """Add `workshop` (with `build` and `clean`) to the `nwor-lab` command's subparsers; run it as `args.func(args)`."""
    w = subparsers.add_parser("workshop", help="the workshop: `build` the kit (every chapter run and exported), `clean` chapters")
    _add_commands(w.add_subparsers(dest="workshop_cmd", required=True, metavar="{build,clean}"))


def main(argv=None) -> int:
    p = LabArgumentParser(prog="python -m nwor_lab.workshop", description=__doc__.split("\n\n")[0],
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_commands(p.add_subparsers(dest="workshop_cmd", required=True, metavar="{build,clean}",
                                   parser_class=LabArgumentParser))

    def dispatch(argv):
        args = p.parse_args(argv)
        return args.func(args)
    return run(dispatch, sys.argv[1:] if argv is None else argv)
