"""The contract: plan, config, session, environment, registry, lifecycle."""
