"""Help pages: the top-level page drawn from an outline of the app (``outline``) and every page
kept once rendered (``cache``); docs/benchmarks.md "CLI start-up"."""
