"""The mnemory REST surface (reference 004) under /api/: thin adapters onto the gateway core."""
