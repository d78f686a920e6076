"""The per-deployment plan: the spec checked (rules), each role's plan (roles), the revision a
prefill/decode pair shares, the data path's fault settings, and the extraArgs the plan admits."""
