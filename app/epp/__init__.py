"""prefixgate as a Gateway API Inference Extension Endpoint Picker (docs/epp.md)."""
