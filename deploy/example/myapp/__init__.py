"""The example app the deploy recipes run: replace it with your own package."""
