"""Admin REST routes about maintenance (consolidation status); master key only."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from services.gateway.admin_auth import require_master

router = APIRouter(prefix="/v1/internal/model/nothing", dependencies=[Depends(require_master)])
