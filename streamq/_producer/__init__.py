"""Queue / AsyncQueue and the sans-IO enqueue preparation; auto-batching; the shared waiter
subscriber."""
