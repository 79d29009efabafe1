"""intentstream's worker side: events in, CLI, and (later) the Redis stream consumer."""
