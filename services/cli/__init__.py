"""`engram`: the operator's command line over the admin REST (services/cli/main.py)."""
