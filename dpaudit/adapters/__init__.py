"""Adapters: plug-ins that run other DP libraries as their users call them, so that
``dpaudit validate --trainer`` and ``--step`` audit the library's own code path.

- :mod:`dpaudit.adapters.opacus`: ``opacus.PrivacyEngine.make_private`` in every
  ``grad_sample_mode`` and ``clipping`` mode (optional extra ``dpaudit[opacus]``; imported
  only when asked for).
"""
