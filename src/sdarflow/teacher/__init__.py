"""Teacher rescoring: student and privileged-context teacher log-probs for every sampled response token
(``rescore``: padded or packed batching), sanity guards that fail loudly (``guards``), and the stage's metrics and
Markdown/HTML report (``report``)."""
