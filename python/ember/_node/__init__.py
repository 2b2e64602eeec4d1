"""The node's room: what runs in a node's own process (started by ember._launcher).

* ``main``  ``python -m ember._node.main``: reads the start-up message, builds the ctx, runs
            the user's ``main_fun(args, ctx)``
* ``env``   a node's environment (TF_CONFIG, torch's rank variables, quiet defaults); the
            launcher builds it with this module, and ember.context reads the same rule

The node's public API stays at the top of the package (ember.context, ember.feed,
ember.collective, ember.keras, ember.torch, ...): users import it by those names.
"""
