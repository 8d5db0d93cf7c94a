"""Every limit an attempt passes before it is sent, one module each holding its ``Gate``, the
``GateOption`` that builds it and its in-process state: ``breaker``, ``adaptive``, ``slots``,
``cooldown``, ``quota``, ``window`` (``rate``), ``announced`` (``rate="auto"``) and
``tokenrate``. ``gate`` says what a gate is, ``shared`` what a backend keeping the limits for
several processes implements, and ``gates.Gates`` runs a run's gates in order for the engine.

May import: core.
"""
