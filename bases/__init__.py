"""Real pretrained bases that a package registry ships (not built here): bases/packaged.py."""
