"""The shared core every surface of the gateway is built on."""
