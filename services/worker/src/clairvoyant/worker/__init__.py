"""The engine: batching, paged KV blocks, radix prefix cache and model runners."""
