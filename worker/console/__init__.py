"""`intentstream console`: a web view of the workers' Redis for the people who set the rules
(docs/console.md). It sits above the commands: it reuses their code paths (rules set, the
backtest, the promotion gate, explain)."""
