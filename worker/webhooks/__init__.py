"""Webhook delivery of the intent actions (docs/webhooks.md): endpoints kept in Redis, each
action POSTed to each endpoint at least once, signed per the Standard Webhooks specification."""
