"""Document quality signals, computed vectorised over a batch of texts (pyarrow + numpy).

``prose`` (Gopher and C4 heuristics), ``code`` (line-length, alphanumeric and generated-file
rules), ``langid`` (py3langid, its model ships in the wheel) and ``classifier`` (a hashed
n-gram linear model trained GPT-3 style). Each rule is a score column and a bound; the
validate stage turns bounds into keep/drop decisions with the rule's name as reason.
"""
