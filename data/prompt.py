"""The prompt: a system message that mandates one final \\boxed{} answer, the problem as the user turn.

The system message is a recipe field (`system_prompt`, recorded in run.json's config and eval objects and in
the run card); SYSTEM_PROMPT is its default, the seed's instruction.
"""

SYSTEM_PROMPT = (
    "Solve the math problem. Reason step by step, then give exactly one final answer "
    "in the form \\boxed{answer} at the end."
)


def prompt_messages(problem: str, system: str = SYSTEM_PROMPT) -> list[dict[str, str]]:
    """Conversational prompt in TRL's format; the trainer renders it with the tokenizer's chat template."""
    return [{"role": "system", "content": system}, {"role": "user", "content": problem}]


def render_prompt(tokenizer, problem: str, system: str = SYSTEM_PROMPT) -> str:
    """The exact text the model sees before its completion (generation prompt included)."""
    return tokenizer.apply_chat_template(
        prompt_messages(problem, system), tokenize=False, add_generation_prompt=True
    )
