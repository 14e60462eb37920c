"""The OAuth 2.0 surface: metadata, registration, authorize + consent, token."""
