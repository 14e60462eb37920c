"""Consumer of the async batch_remember queue (filled in by the ingest work)."""
