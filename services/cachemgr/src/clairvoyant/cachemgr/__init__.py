"""The cache manager: the cluster-wide KV index and the cache policy's directives to the workers
(``python -m clairvoyant.cachemgr``; docs/cache-manager.md)."""
