"""Teacher rescoring: student and privileged-context teacher log-probs for every sampled response token."""
