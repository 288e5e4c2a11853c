"""The autoscaler service.  Its code lands with its own issue; see README.md in this package."""
