"""Training drafters for a target by self-distillation (`specdec train-drafter`): the data
(`data`), the loop (`train`) and the command (`cli`). Drafting with the result lives in
specdec.drafters.trained; nothing there imports from here."""
