"""The decoding core: the engine's rounds (draft, verify, accept, roll back), batching several
requests a step, rejection sampling, the samplers, the draft-length policy, the statistics and the
paper's theory."""
