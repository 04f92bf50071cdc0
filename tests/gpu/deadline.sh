# Sourced by the GPU scripts: `timeout $(lim 240) cmd` runs cmd for at most 240 s, cut so that it
# ends 5 s before DEADLINE (epoch seconds) when DEADLINE is set; never less than 1 s.
lim() { local l=$1; if [ -n "${DEADLINE:-}" ]; then local r=$((DEADLINE - $(date +%s) - 5)); [ "$r" -lt "$l" ] && l=$r; fi
        [ "$l" -lt 1 ] && l=1; echo "$l"; }
