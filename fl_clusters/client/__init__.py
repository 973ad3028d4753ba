"""The client core: what a node does with each message, shared by both client paths.

The built-in ClientApp (:mod:`fl_clusters.client_app`, fl-clusters' own data and
models) and :class:`~fl_clusters.adapter.ClusteredClient` (a Flower user's own
model, loaders and train/evaluate handlers) both build on these modules:

* :mod:`~fl_clusters.client.task`: reading a task message and answering it;
* :mod:`~fl_clusters.client.choice`: which model the node trains or evaluates;
* :mod:`~fl_clusters.client.replies`: train and evaluate with fl-clusters' learner;
* :mod:`~fl_clusters.client.fedem`: FedEM's mixture train and evaluate;
* :mod:`~fl_clusters.client.user_training`: how a user's handler trains, for FedEM's M-step;
* :mod:`~fl_clusters.client.queries`: the one table of queries and their handlers;
* :mod:`~fl_clusters.client.loader_learner`: scoring on a user's data loaders;
* :mod:`~fl_clusters.client.node_data`: the built-in app's per-node data and learners.
"""
