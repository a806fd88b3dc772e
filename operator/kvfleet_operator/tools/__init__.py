"""Developer tools over the CRD: `crd_docs` (docs/inferencepool.md) and `crd_validate`
(offline validation of pools against the CRD's schema and CEL rules)."""
