"""What every command line of the lab shares (`nwor-lab`, the benchmarks, `python -m nwor_lab.sweep`,
`python -m nwor_lab.workshop`, `python -m nwor_lab.vllm`): the flags' value types (`args`), the one
error path (`errors`), the configuration, device and backend a command runs with (`environment`),
and the `generate` command's flags and printed lines (`generate_flags`).

It sits below every front end and imports none of them; the `nwor-lab` command itself is
`nwor_lab.cli`, which nothing in the package imports."""
