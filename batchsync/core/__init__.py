"""The generic engine and what it stands on: items in, one Result each out, bounded and retried.

An attempt's ``Verdict`` and what each error kind means (``verdict``, ``kinds``), the retry
decision (``decide``, ``backoff``, ``budget``), the ``Result`` and its JSON record, the
``Task`` a job gives, the observers, the clock every wait goes through, the redaction of
secrets, and the ``engine`` that runs a job over the items. It knows nothing of HTTP, nor of
which limits there are: it lets attempts in through the ``Admitter`` of ``admission``.

May import: nothing else of the package.
"""
