"""Results: the store of record, read back as frames, and generated stores for tests."""
