"""Constrained decoding: grammars (JSON schema, regex, EBNF) compiled by xgrammar into per-token
masks. xgrammar is imported only when a request asks for a constraint."""
