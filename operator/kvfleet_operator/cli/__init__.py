"""The `kvfleet` console script: `main` dispatches to `up`, `status`, `operator`, `engine`,
`router`, `sim` and `bench`; `demo` is `make run`."""
