"""The live view of campaigns as they run: a page that updates without reloading, Prometheus' /metrics, and
what campaigns publish for it on a shared store (docs/live.md). Imported only by `rtvirt serve` and by
`rtvirt run --serve` or on a shared store: the CLI starts without it."""
