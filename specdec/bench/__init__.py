"""`specdec bench`: the paper's experiments on this machine, with peers measured in the same run."""
