"""The merge rule, syncer side: when a fragment round merges (`quorum`: minimum quorum plus adaptive grace window),
how learners' updates combine into one outer gradient (`outer_gradient`: token weights, finiteness), and the outer
Nesterov step applied to the global model (`outer_optimizer`)."""
