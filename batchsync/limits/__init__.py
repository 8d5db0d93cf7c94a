"""Every limit an attempt passes before it is sent, each one a ``Gate``: rates and token
budgets over sliding windows, the counts a provider announces, host slots, cooldowns, a
quota's reset, the circuit breaker and the adaptive limit; ``gates.Gates`` runs them in order
for the engine, in-process or through a shared backend.

May import: core.
"""
