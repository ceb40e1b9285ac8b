"""Rule families, one module each (before -> after and the math in each docstring):
fold_batchnorm, fuse_activation, fold_constants, eliminate_dead, eliminate_common,
remove_noops, propagate_views, align_scales, fold_groupnorm."""
