"""All SQL lives here, one module per aggregate. Every query takes the caller's Principal
and writes its tenant filter through shared.domain.principal."""
