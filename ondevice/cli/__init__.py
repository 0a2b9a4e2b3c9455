"""The `ondevice` command line: thin wrappers over the library that render results."""
