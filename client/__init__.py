"""vkact's Python client (numpy and httpx only)."""
