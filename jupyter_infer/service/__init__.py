"""The service seam the server and the embedded client talk to: the ``Service`` protocol
(``protocol``), ``InferenceService`` (one loop, one engine or upstream: ``inference``), the
router over several services (``router``, its rule in ``routing``), owners' budgets
(``owners``) and the factory that builds the configured one (``service_factory``)."""
