"""The admin REST surface (/v1/...): keys, groups, import/export, maintenance."""
