"""The embedded default: the shipped base (`base/`) and task snapshot, and their builder (`embedded.build`)."""
