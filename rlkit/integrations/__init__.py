"""rlkit's estimators inside other training engines (docs/scaling-out.md).

:mod:`rlkit.integrations.verl` maps verl's flat batch to rlkit's grouped rewards and back, without
importing verl; :mod:`rlkit.integrations.verl_plugin` registers it with verl (``pip install
rlkit[verl]``, in its own environment).
"""
