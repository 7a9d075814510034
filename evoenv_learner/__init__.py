"""The EvoEnv learner: orchestrator, GRPO trainer and weight publisher in one asyncio process."""
