"""The parts of `analyses/qk_findings.py` (issue 48): `smollm2`, `sraven` and their shared `controls`."""
