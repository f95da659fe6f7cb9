"""What the kinds compute with beyond the core: ranking metrics and AUC exact on any replica
count (retrieval, click-through), and the retrieval kind's global in-batch loss."""
