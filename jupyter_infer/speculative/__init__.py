"""Speculative decoding, on one floor (SGLang's ``speculative/``): who guesses and how many
(``guessing``, the scheduler's policy and its draft-token budget), where the guesses come from
(``ngram``: prompt lookup; ``draft_model``: a smaller model), which rows propose them in a step
(``proposals``), and which of them a row keeps (``acceptance``). It sits below the scheduler
and the engine, which both use it: the scheduler puts each row's allowance in the
``StepPlan``, the engine proposes, verifies in its forward (``engine/hf/draft_columns.py``:
where the guesses sit in its ragged blocks) and says what each row kept."""
