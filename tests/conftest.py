"""Test setup: 4 logical CPUs (before any TensorFlow op) and small shared datasets."""

import fcntl
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import loops  # noqa: E402

loops.configure_logical_cpus(4)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

# The slow tier, marked `slow` here so that `pytest -m "not slow" -n 2 tests` runs the
# in-process core in a few minutes (BUILD.md, "Build, test, run"). Slow: tests that start
# subprocesses, binaries or clusters, or train for long. An entry is a test file (all of
# it) or `file::name`, name a test function's name or an fnmatch pattern of it (every
# parameter of it). tests/test_suite_tiers.py checks that every entry names a file and
# test that exist, so a renamed slow test cannot drop silently into the fast tier.
SLOW_TESTS = (
    "test_actions.py::test_two_workers_stop_at_the_same_step_and_only_the_chief_writes",
    "test_actions.py::test_classifier_flags_stop_early_keep_the_best_and_still_export",
    "test_actions.py::test_keep_best_keeps_the_checkpoint_of_the_best_evaluation",
    "test_actions.py::test_resume_keeps_the_best_value",
    "test_actions.py::test_early_stopping_stops_at_the_expected_step_and_says_why",
    "test_benchmark.py",
    "test_ci_checks.py::*lint_imports*",
    "test_ci_checks.py::test_the_layer_contracts_hold_on_a_copy_of_the_tree",
    "test_ci_checks.py::test_an_import_cycle_fails_even_through_type_checking",
    "test_classifier_binary.py::test_default_flags_train_digits_on_two_replicas",
    "test_classifier_binary.py::test_a_bad_flag_exits_non_zero_with_the_reason",
    "test_classifier_binary.py::test_multi_worker_mirrored_runs_as_a_one_worker_cluster_its_tf_config_names",
    "test_classifier_binary.py::test_central_storage_with_dropout_trains_digits",
    "test_classifier_binary.py::test_a_cnn_evaluation_with_an_empty_replica_runs_on_eigen_and_is_explained_on_onednn",
    "test_cli.py::test_help_lists_every_own_flag_under_its_heading_without_tensorflow",
    "test_cli.py::test_a_typo_in_an_enum_flag_names_the_allowed_values_without_tensorflow",
    "test_cli.py::test_every_float_flag_refuses_values_that_are_not_finite",
    "test_cli.py::test_console_script_and_module_give_the_same_help",
    "test_cli.py::test_a_default_run_from_a_directory_with_its_own_data_and_models_is_quiet_and_recorded",
    "test_cli.py::test_importing_tensorflow_quietly_holds_back_only_its_log_lines",
    "test_cluster_faults.py::test_a_task_whose_peers_never_come_up_names_them_within_its_bound",
    "test_cluster_faults.py::test_the_binary_says_which_worker_is_missing_without_a_traceback",
    "test_cluster_faults.py::test_sigterm_while_waiting_exits_promptly_as_preempted",
    "test_cluster_faults.py::test_waiting_tasks_see_each_other_and_stop_waiting",
    "test_config.py::test_a_declared_setting_reaches_the_flags_help_results_and_config_json",
    "test_config.py::test_a_binary_restarts_from_a_runs_config_json",
    "test_contrastive.py::test_negatives_from_the_whole_batch_give_the_same_numbers_on_1_2_and_4_replicas",
    "test_controller.py::test_the_trainer_shows_the_state_and_run_context_of_its_controller",
    "test_ctr.py::test_each_builder_trains_equally_on_1_2_and_4_replicas_with_empty_bags",
    "test_ctr.py::test_the_readme_example_comes_near_the_planted_truths_auc",
    "test_ctr.py::test_on_several_workers_every_replica_gathers_every_eval_row_for_the_same_auc",
    "test_ctr.py::test_dlrm_tables_trained_by_adagrad_are_sparse_and_equal_on_1_and_4_replicas",
    "test_ctr.py::test_placed_tables_split_over_replicas_train_equally_on_1_2_and_4_replicas",
    "test_ctr.py::test_ragged_bags_train_as_padded_ones_on_1_2_and_4_replicas",
    "test_ctr_binary.py::test_the_binary_keeps_the_best_auc_and_exports_the_live_models_probabilities",
    "test_ctr_binary.py::test_the_adult_benchmark_writes_its_json_on_a_stand_in_of_the_wheel",
    "test_environments.py::test_a_users_environment_gives_the_same_numbers_on_1_and_2_replicas",
    "test_environments.py::test_ppo_learns_to_pull_the_better_arm",
    "test_environments.py::test_dqn_learns_the_value_of_each_arm",
    "test_eval_pictures.py::test_tensorboard_and_results_hold_the_pictures_and_the_matrix",
    "test_eval_pictures.py::test_the_ring_gan_writes_a_scatter_of_its_samples_over_the_modes",
    "test_evaluator_config.py::test_the_evaluator_binary_exits_1_naming_an_ema_decay_that_evaluates_other_weights",
    "test_export.py::test_the_gan_binary_exports_the_generator_it_trained",
    "test_export.py::test_export_reloads_with_and_without_a_strategy_and_matches_the_model",
    "test_export.py::test_generator_export_serves_the_moving_average_outside_and_inside_a_strategy",
    "test_exact_parameter_server.py::test_two_workers_and_two_servers_are_exact_resumable_and_survive_a_lost_worker",
    "test_exact_ps_kinds.py::test_the_recommenders_lm_gan_and_ctr_train_exactly_on_two_workers_and_two_servers",
    "test_fault_injection.py",
    "test_fault_tolerance.py",
    "test_faults_cluster.py::test_a_bad_or_missing_cluster_is_refused_before_tensorflow_loads",
    "test_faults_cluster.py::test_a_malformed_scheduler_environment_is_a_sentence_before_tensorflow_loads",
    "test_faults_cluster.py::test_a_cluster_strategy_in_a_batch_scripts_shell_is_told_to_use_srun",
    "test_faults_cluster.py::test_an_own_port_taken_by_another_program_is_refused_before_tensorflow_loads",
    "test_faults_cluster.py::test_a_foreign_program_on_a_peers_port_is_named_as_such",
    "test_faults_cluster.py::test_tensorflows_own_start_is_bounded",
    "test_faults_cluster.py::test_sigterm_while_waiting_for_peers_exits_42",
    "test_faults_cluster.py::test_sigterm_inside_tensorflows_start_exits_42",
    "test_faults_cluster.py::test_tensorflows_server_listens_on_every_interface_as_the_launcher_says",
    "test_faults_data.py::test_the_binary_refuses_a_damaged_folder_then_trains_past_it_with_skip_bad_images",
    "test_faults_data.py::test_a_file_damaged_during_training_is_named_after_the_last_checkpoint",
    "test_faults_data.py::test_a_data_dir_that_is_a_file_is_refused_before_work",
    "test_faults_data.py::test_skip_bad_images_without_an_image_dir_is_refused",
    "test_faults_model_dir_and_flags.py::test_a_bad_flag_is_refused_before_any_work",
    "test_faults_model_dir_and_flags.py::test_deleting_the_lock_file_does_not_let_a_second_run_in",
    "test_faults_model_dir_and_flags.py::test_a_preemption_signal_while_tensorflow_imports_is_the_preemption_exit",
    "test_faults_model_dir_and_flags.py::test_sigterm_while_an_evaluator_waits_for_the_runs_config_is_the_preemption_exit",
    "test_faults_resume_and_flags.py::test_a_damaged_config_json_resumes_to_the_weights_of_an_undamaged_one",
    "test_faults_resume_and_flags.py::test_the_evaluator_of_a_finished_run_ends_without_train_steps",
    "test_faults_resume_and_flags.py::test_profile_steps_past_train_steps_are_refused_before_tensorflow",
    "test_faults_resume_and_flags.py::test_an_export_dir_on_a_read_only_file_system_is_refused_before_training",
    "test_faults_resume_and_flags.py::test_a_binary_flagfile_stops_the_binary_with_its_sentence",
    "test_faults_resume_and_flags.py::test_async_checkpoints_under_a_cluster_strategy_are_said_to_be_synchronous",
    "test_gan.py::test_default_flags_shortened_cover_the_ring",
    "test_gan.py::test_the_averaged_generator_is_as_good_as_the_raw_one_early_in_training",
    "test_gan.py::test_digits_writes_sample_grids",
    "test_gan.py::test_a_bad_flag_exits_non_zero_with_the_fix",
    "test_gan.py::test_ring_losses_and_weights_match_on_1_2_and_4_replicas",
    "test_gan.py::test_image_networks_match_on_1_and_4_replicas",
    "test_gan.py::test_resume_continues_with_the_next_batches_and_the_counters",
    "test_gan.py::test_noise_differs_across_replicas_and_steps_and_repeats_for_the_seed",
    "test_gan.py::test_a_non_finite_update_is_skipped_on_every_replica_and_reported",
    "test_gan.py::test_each_critic_update_reads_the_weights_the_previous_one_wrote",
    "test_gan.py::test_interpolation_weights_lie_in_0_1_and_differ_per_example",
    "test_grad_accumulation.py::test_gan_micro_batches_equal_the_whole_batch_and_keep_parity",
    "test_grad_accumulation.py::test_classifier_micro_batches_keep_replica_parity_with_dropout",
    "test_grad_accumulation.py::test_classifier_micro_batches_equal_the_whole_batch_on_one_replica",
    "test_grad_accumulation.py::test_dropout_masks_really_differ_per_example",
    "test_health.py::test_the_gan_reports_each_networks_health_and_ppo_its_updates",
    "test_health.py::test_gradient_norm_and_update_ratios_equal_a_float64_computation",
    "test_health.py::test_the_clipped_flag_agrees_with_the_clip_norm_and_the_ratio_with_the_sgd_step",
    "test_hosts_apart.py",
    "test_jit_compile.py::test_the_binary_flag_compiles_with_xla",
    "test_jit_compile.py::test_compiled_and_plain_agree_to_rounding",
    "test_jit_compile.py::test_the_language_model_compiled_keeps_replica_parity",
    "test_jit_compile.py::test_the_classifier_compiled_keeps_replica_parity",
    "test_jit_compile.py::test_dropout_draws_xlas_random_stream",
    "test_jit_compile.py::test_each_replica_runs_its_forward_and_backward_pass_through_xla",
    "test_jit_compile.py::test_synchronized_batch_norm_on_two_replicas_is_refused",
    "test_joined_calls.py::test_inner_loops_are_joined_between_evaluations_and_report_the_same",
    "test_launch.py::test_two_workers_give_one_machines_weights_and_loss",
    "test_launch_network.py",
    "test_launch.py::test_two_srun_tasks_find_their_cluster_and_give_one_machines_weights",
    "test_launch.py::test_preempted_then_killed_worker_and_reruns_finish_with_one_machines_weights",
    "test_launch.py::test_each_loop_on_two_workers_gives_one_machines_step_losses_and_weights",
    "test_launch.py::test_ctr_on_two_workers_evaluates_and_tests_every_row_as_one_process_does",
    "test_launch.py::test_every_task_gets_its_tf_config_and_prefixed_output_and_servers_are_stopped",
    "test_launch.py::test_a_failing_task_is_named_and_the_others_are_stopped_even_one_that_ignores_sigterm",
    "test_launch.py::test_a_preemption_signal_to_the_launcher_is_forwarded_to_every_task",
    "test_launch.py::test_a_second_signal_kills_tasks_that_do_not_stop",
    "test_launch.py::test_tasks_exiting_42_make_the_launcher_exit_42_and_are_not_a_failure",
    "test_launch.py::test_a_preempted_chief_ends_the_run_with_42_and_its_servers_are_stopped",
    "test_launch.py::test_a_failure_beside_a_preemption_still_fails_the_run",
    "test_launch.py::test_sigterm_goes_to_the_chief_alone_until_it_has_saved_then_the_servers_stop",
    "test_launch.py::test_an_evaluator_task_is_outside_the_cluster_and_the_launcher_waits_for_it",
    "test_launch.py::test_servers_stopped_after_the_chief_are_no_failure_while_the_evaluator_finishes",
    "test_launch.py::test_a_failing_evaluator_leaves_training_running_then_fails_the_launch",
    "test_launch.py::test_a_preempted_run_stops_its_evaluator_and_exits_42",
    "test_launch.py::test_sigterm_to_the_launcher_reaches_the_evaluator_too",
    "test_launch.py::test_a_module_runs_with_this_python_and_a_program_as_given",
    "test_launch.py::test_the_launcher_starts_without_importing_tensorflow",
    "test_layering.py::test_importing_every_framework_module_loads_no_example_package",
    "test_layering.py::test_the_controller_and_the_actions_do_not_import_the_loop_module",
    "test_lm.py::test_the_default_binary_shortened_beats_half_the_unigram_perplexity",
    "test_lm.py::test_a_warm_up_given_past_the_run_is_refused",
    "test_lm.py::test_a_width_the_heads_do_not_divide_is_refused_with_one_that_fits",
    "test_lm.py::test_losses_weights_and_eval_match_on_1_2_and_4_replicas",
    "test_lm.py::test_gradient_accumulation_equals_one_batch_on_one_replica",
    "test_lm.py::test_a_replica_without_real_tokens_is_exact",
    "test_lm.py::test_plain_sgd_trains_the_token_embedding_sparsely_with_parity_on_1_and_4_replicas",
    "test_lm.py::test_samples_are_the_same_text_on_1_and_2_replicas",
    "test_lm.py::test_eval_perplexity_equals_a_float64_computation_over_the_same_weights",
    "test_lr_finder.py::test_find_lr_from_a_finished_run_leaves_its_model_dir_untouched",
    "test_lr_finder.py::test_the_suggestion_on_digits_lies_where_a_short_run_trains_well",
    "test_lr_finder.py::test_every_binary_runs_the_range_test",
    "test_lr_finder.py::test_every_optimizer_follows_the_geometric_rates_on_two_replicas_and_the_state_comes_back",
    "test_mixed_precision.py::test_binary_trains_digits_in_mixed_precision",
    "test_mixed_precision.py::test_inf_on_one_replica_of_four_skips_the_step_on_all_and_halves_the_scale",
    "test_mixed_precision.py::test_float16_overflow_on_one_replica_lowers_the_scale_without_stopping_the_run",
    "test_mixed_precision.py::test_scale_doubles_after_growth_steps_finite_steps",
    "test_mixed_precision.py::test_resume_continues_the_loss_scale",
    "test_own_files.py::test_an_output_dir_on_a_read_only_file_system_is_refused_before_the_range_test",
    "test_own_files.py::test_the_binary_refuses_another_users_default_parent_before_tensorflow_loads",
    "test_parameter_server.py::test_a_sigterm_to_the_chief_saves_and_exits_42_and_the_rerun_survives_a_killed_worker",
    "test_parameter_server.py::test_the_launcher_ends_with_the_chief_and_stops_the_servers",
    "test_parameter_server.py::test_a_server_dying_before_the_chief_fails_the_run_naming_it",
    "test_parameter_server.py::test_a_lost_worker_of_a_chief_is_survived_and_the_last_one_fails_the_run",
    "test_parity.py::test_cnn_on_an_empty_replica_is_exact_with_eigen_and_explained_with_onednn",
    "test_parity.py::test_the_empty_replica_note_is_never_added_for_a_model_without_convolutions",
    "test_placed_tables.py::test_a_checkpoint_moves_from_4_replicas_to_2_workers_to_3_servers_to_one_process",
    "test_profiling.py::test_the_flag_traces_from_a_binary_and_refuses_a_bad_range",
    "test_ps_binary_parity.py",
    "test_loss_spikes.py::test_a_spike_is_rolled_back_past_a_checkpoint_saved_during_it",
    "test_readme.py::test_readme_subclass_example_trains",
    "test_recommender.py::test_placed_tables_split_over_the_replicas_train_and_export_as_one_replica_does",
    "test_recommender.py::test_the_binary_refuses_a_model_larger_than_memory_before_building_it",
    "test_recommender.py::test_the_default_binary_run_shortened_beats_popularity_by_half_again",
    "test_recommender.py::test_*_on_1_2_and_4_replicas*",
    "test_recommender.py::test_the_readme_example_trains_a_retrieval_model_that_beats_popularity",
    "test_recommender.py::test_the_binary_rating_model_shortened_beats_the_bias_baseline_by_a_tenth",
    "test_recommender.py::test_the_binary_exports_the_logs_own_ids_and_refuses_a_top_k_above_its_items",
    "test_recommender.py::test_the_movielens_benchmark_trains_both_models_on_the_wheels_file_and_prints_the_table",
    "test_recommender.py::test_the_peers_benchmark_writes_loops_split_and_refuses_without_its_extra",
    "test_log_identity.py::test_the_binary_refuses_a_permuted_log_goes_on_with_the_same_and_its_evaluator_reads_it",
    "test_readme.py::test_readme_export_example_serves_the_greedy_continuation",
    "test_readme.py::test_readme_update_without_a_definition_trains",
    "test_recover.py::test_every_binary_recovers_from_its_flags",
    "test_recover.py::test_two_workers_recover_as_one_process_does",
    "test_recover.py::test_a_binary_stops_past_max_recoveries_with_the_error",
    "test_recover.py::test_the_rl_binary_takes_recover",
    "test_recover.py::test_bad_recovery_flags_are_refused_with_the_fix",
    "test_recover.py::test_rl_recovers_by_drawing_the_data_after_the_bad_steps",
    "test_retrieval_loss.py::test_negatives_from_the_whole_batch_train_alike_on_1_2_and_4_replicas",
    "test_rl.py::test_default_loops_rl_shortened_learns_cartpole_on_two_replicas",
    "test_rl.py::test_the_same_run_gives_bit_identical_weights_beside_busy_processes",
    "test_rl.py::test_dqn_binary_writes_results_and_resumes",
    "test_rl.py::test_a_bad_flag_combination_exits_with_the_fix",
    "test_rl.py::test_a_flag_past_its_declared_upper_bound_is_refused_when_parsed",
    "test_rl.py::test_a_diverging_rl_run_follows_the_policy_and_keeps_no_nonfinite_checkpoint",
    "test_scheduler_cluster.py::test_a_binary_started_by_srun_as_several_one_process_tasks_stops_before_tensorflow",
    "test_scheduler_cluster.py::test_the_slurm_template_gives_each_task_its_place_and_requeues_a_preempted_job",
    "test_setting_forms.py::test_the_classifier_records_every_setting_given_in_its_documented_form",
    "test_setting_forms.py::test_readmes_movielens_command_reads_data_under_home_and_a_long_top_k_names_the_flag",
    "test_sharded_tables.py::test_a_table_split_over_two_servers_equals_one_process_and_restores_into_three_then_one",
    "test_table_training.py::test_a_table_split_over_two_servers_trains_through_the_trainer",
    "test_settings.py::test_every_binary_lists_every_setting_under_its_heading_with_its_declared_help",
    "test_settings.py::test_a_binary_defines_its_flags_only_through_declarations",
    "test_settings.py::test_a_run_takes_its_settings_from_a_flagfile_with_command_line_overrides",
    "test_sidecar.py::test_the_gan_binary_evaluates_its_checkpoints_beside_its_training",
    "test_sidecar.py::test_the_rl_binary_evaluates_its_checkpoints_by_greedy_episodes",
    "test_sidecar.py::test_the_rl_binary_needs_eval_episodes_to_evaluate_checkpoints",
    "test_sidecar.py::test_an_evaluator_task_evaluates_every_checkpoint_the_chief_kept_then_exits",
    "test_sparse_tables.py::test_two_workers_equal_the_float64_reference_with_a_partial_batch_that_empties_one",
    "test_strategies.py::test_onednn_enabled_agrees_with_tensorflows_log_and_leaves_the_switch_alone",
    "test_dynamic_ctr.py::test_loops_ctr_admits_dynamic_ids_alike_on_1_and_2_replicas_and_the_export_flags_them",
    "test_dynamic_ctr.py::test_loops_ctr_with_dynamic_columns_killed_mid_run_resumes_the_same_map_on_any_layout",
    "test_streamed_ctr.py::test_loops_ctr_on_shards_killed_mid_epoch_resumes_bit_identical_on_this_and_another_layout",
    "test_streaming.py::test_sigterm_and_kill_9_mid_epoch_resume_with_the_same_batches_and_weights",
    "test_streaming.py::test_two_workers_preempted_mid_epoch_resume_with_one_machines_batches",
    "test_streaming.py::test_streamed_data_saved_by_two_workers_continues_on_one_process_with_the_same_batches",
    "test_streaming.py::test_image_dir_trains_and_a_resumed_run_ends_with_the_same_weights",
    "test_streaming.py::test_the_binary_names_a_bad_folder_and_a_bad_size_before_any_work",
    "test_text_generation.py::test_the_exported_generator_serves_greedy_text_with_tensorflow_alone",
    "test_topology_restart.py",
    "test_update_flags.py",
    "test_faults_v6_flags.py::test_sizes_no_machine_holds_are_refused_before_tensorflow",
    "test_faults_v6_flags.py::test_a_binarys_export_records_its_model_dir",
    "test_faults_v6_export.py::test_the_binary_refuses_columns_served_under_one_name_before_training",
    # The fast tier under 5 minutes of CPU on 2 cores (issue 65): the longest tests of
    # what was left, by `pytest -m "not slow" -n 2 --durations=0 tests`.
    "test_ctr.py::test_the_binarys_table_optimizer_setting_trains_the_tables_by_the_optimizer_it_names",
    "test_data.py::test_the_logs_read_into_memory_load_without_tensorflow_datasets",
    "test_eval_pictures.py::test_the_confusion_matrix_counts_the_eval_set_and_its_diagonal_is_the_accuracy",
    "test_evaluator_config.py::test_an_evaluator_given_none_of_the_runs_settings_takes_them_and_the_runs_numbers",
    "test_new_step.py::test_a_nan_on_one_replica_follows_the_policy",
    "test_new_step.py::test_gradient_accumulation_on_weighted_partial_batches",
    "test_new_step.py::test_mixed_float16_gets_a_loss_scale_the_step_does_not_write",
    "test_new_step.py::test_progress_summaries_checkpoints_and_exact_resume",
    "test_new_step.py::test_replica_parity_on_weighted_partial_batches",
    "test_nonfinite.py::test_stop_names_the_step_saves_nothing_after_it_and_goes_back_to_the_checkpoint",
    "test_parity.py::test_central_storage_matches_mirrored_and_one_replica",
    "test_parity.py::test_cnn_with_gradient_clipping",
    "test_parity.py::test_dropout_keyed_on_the_example_keeps_parity",
    "test_parity.py::test_evaluation_counts_every_example_once",
    "test_parity.py::test_mlp_with_l2_and_synchronized_batch_norm",
    "test_ranking_metrics.py::test_auc_gathered_from_every_replica_equals_the_pairwise_count",
    "test_ranking_metrics.py::test_recall_and_ndcg_equal_numpy_on_every_replica_count",
    "test_recommender.py::test_the_export_serves_the_logs_own_ids_and_never_another_row_for_an_unknown_one",
    "test_results.py::test_results_hold_the_config_versions_history_and_plain_numbers",
    "test_results.py::test_tensorboard_gets_an_hparams_summary_of_the_config",
    "test_rl.py::test_greedy_episodes_give_the_same_returns_on_any_replica_count",
    "test_rl.py::test_ppo_gives_the_same_trajectories_losses_and_weights_on_1_and_2_replicas",
    "test_schedules.py::test_the_loop_reports_the_rate_of_each_step_and_continues_it_after_a_resume",
    "test_setting_owners.py::test_a_setting_as_a_keyword_and_in_a_run_config_reaches_the_same_part_or_is_refused_alike",
    "test_sparse_tables.py::test_adagrad_rows_equal_a_float64_reference_on_every_replica_count",
    "test_sparse_tables.py::test_clipping_and_the_health_norm_see_the_dense_gradients_global_norm",
    "test_table_plan.py::test_a_plan_places_the_large_embedding_and_trains_it_as_the_plain_layer_on_any_count",
    "test_table_plan.py::test_a_planned_checkpoint_of_4_replicas_resumes_on_one_to_the_uninterrupted_numbers",
    "test_table_plan.py::test_each_replica_holds_only_its_block_and_results_json_says_where_each_table_lives",
    "test_table_training.py::test_a_split_table_resumed_from_a_checkpoint_trains_as_the_uninterrupted_run",
    "test_throughput_units.py::test_examples_per_second_is_the_counted_examples_over_the_same_time",
    "test_update.py::test_an_update_clips_the_summed_gradient_and_adds_regularization_once",
    "test_update.py::test_skip_leaves_out_the_update_an_inf_on_one_replica_poisons",
    "test_update.py::test_stop_names_the_step_and_goes_back_to_the_checkpoint",
    "test_update_contract.py::test_accumulation_weights_by_the_count_the_loss_is_divided_by_not_the_first_taken",
    "test_weight_average.py::test_a_new_kind_of_step_gets_the_average_from_its_update",
    "test_weight_average.py::test_a_resumed_run_averages_exactly_as_an_uninterrupted_one",
    "test_weight_average.py::test_averages_agree_on_1_2_and_4_replicas",
    "test_weight_average.py::test_evaluation_uses_the_averages_and_leaves_the_trained_weights",
    "test_weight_average.py::test_the_evaluator_beside_a_run_evaluates_its_averaged_weights",
    # Issue 67's and the streamed logs' longest, by the same measure (2026-12-02).
    "test_launch.py::test_dynamic_tables_on_two_workers_make_one_processs_admissions_and_figures",
    "test_streamed_ctr.py::test_streamed_shuffled_batches_give_the_same_numbers_on_1_2_and_4_replicas",
    "test_streamed_recommender.py::test_loops_recommender_on_shards_killed_mid_epoch_resumes_bit_identical_here_and_moved",
    "test_streamed_recommender.py::test_streamed_shuffled_batches_give_the_same_numbers_on_1_2_and_4_replicas",
    "test_streamed_recommender.py::test_format_and_a_time_split_are_taken_as_documented_by_the_binary",
    "test_streamed_ctr.py::test_streamed_rows_train_as_the_same_rows_held_in_memory",
    "test_dynamic_recommender.py::test_dynamic_tables_smaller_than_the_log_evict_alike_on_1_and_2_replicas",
    "test_dynamic_recommender.py::test_the_binary_with_dynamic_ids_reports_each_tables_admissions_and_evictions",
    "test_dynamic_recommender.py::test_with_room_for_every_id_dynamic_tables_equal_static_tables_started_by_id",
    # Issue 68's binaries: two or three runs of loops-recommender each (2026-12-03).
    "test_warm_start.py::test_loops_recommender_*",
    "test_ctr_continuation.py::test_loops_ctr_continues_day_by_day_onto_a_log_of_shards_with_delta_exports",
    "test_continuation.py::test_loops_recommender_continues_a_run_on_the_next_days_log",
    "test_continuation.py::test_a_dynamic_id_continuation_sends_its_maps_changes_and_patches_bit_for_bit",
    "test_continuation.py::test_a_continuation_on_two_workers_ends_as_one_run_over_both_days",
    "test_dynamic_tables.py::test_a_checkpoint_at_an_evicting_step_resumes_the_same_map_on_another_layout",
    "test_dynamic_tables.py::test_maps_and_counters_are_bit_identical_on_1_2_and_4_replicas_rows_to_1e_6",
    "test_dynamic_tables.py::test_an_export_answers_admitted_evicted_waiting_and_unseen_ids_in_plain_tensorflow",
    "test_weight_average.py::test_the_average_is_the_debiased_recurrence_of_the_trained_weights",
    "test_update_contract.py::test_a_float16_definition_that_lists_only_its_own_objects_resumes_with_its_loss_scale",
    "test_streaming.py::test_a_batch_holds_the_stored_examples_at_the_shuffled_indices",
    "test_streaming.py::test_each_epoch_is_a_new_permutation_of_every_example_and_augmentation_differs",
    "test_streaming.py::test_lowered_input_threads_give_the_same_batches_and_only_they_are_lowered",
    "test_bad_step_rules.py::test_recover_goes_on_with_the_weights_of_a_run_without_its_batches",
    "test_rl.py::test_dqn_clearly_beats_a_random_policy",
    "test_doc_figures.py::test_readme_alone_quotes_a_test_count_and_it_is_what_pytest_collects",
    "test_eval_pictures.py::test_the_confusion_matrix_and_worst_images_are_identical_on_1_2_and_4_replicas",
    "test_faults_v6_ctr_columns.py::test_each_numeric_column_adds_one_slice_a_replica_to_the_eval_pass_and_the_train_step",
    "test_faults_v6_flags.py::test_the_counted_weights_of_each_ctr_model_are_keras_own",
    "test_faults_v6_tables.py::test_an_embedding_tables_split_lookup_is_sized_by_the_updates_max_table_lookups",
    "test_lazy_adam.py::test_a_keras_embedding_trains_by_rows_through_the_update_as_dense_lazy_adam",
    "test_loop.py::test_checkpoint_cadence_and_results_file",
    "test_loop.py::test_resume_matches_an_uninterrupted_run",
    "test_recommender.py::test_a_run_whose_validation_turns_up_exports_and_tests_its_best_checkpoint",
    "test_recommender.py::test_retrieval_eval_equals_the_reference_over_the_trained_towers",
    "test_recover.py::test_a_checkpoint_from_before_the_recovery_record_restores_as_no_recovery",
    "test_recover.py::test_a_recovered_run_ends_with_the_weights_of_a_run_without_the_bad_batches",
    "test_recover.py::test_a_resume_after_a_recovery_reads_on_where_the_recovered_run_did",
    "test_recover.py::test_a_run_without_a_checkpoint_saves_one_at_its_start_to_go_back_to",
    "test_recover.py::test_past_max_recoveries_it_stops_with_the_error_and_keeps_finite_checkpoints",
    "test_retrieval_loss.py::test_the_first_batch_loss_equals_numpy_with_log_q_and_hits_removed",
    "test_rl.py::test_a_resumed_dqn_run_continues_exactly",
    "test_rl.py::test_dqn_gives_the_same_trajectories_losses_and_weights_on_1_and_2_replicas",
    "test_rl.py::test_dqn_loop_copies_its_target_network_every_k_steps",
    "test_sidecar.py::test_a_language_models_evaluator_writes_its_metrics_and_samples_like_the_trainer",
    "test_sidecar.py::test_no_new_checkpoint_before_the_run_ends_times_out_and_a_rerun_goes_on",
    "test_sparse_tables.py::test_a_table_optimizer_trains_the_tables_and_is_checkpointed",
    "test_sparse_tables.py::test_sgd_rows_equal_a_float64_reference_on_four_replicas_one_empty",
    "test_table_training.py::test_a_table_split_over_1_2_and_4_replicas_trains_the_same_clipped_by_the_trainer",
)


def is_slow(path, name):
    """Whether the test function `name` (no parameters) in the file `path` is slow."""
    file = os.path.basename(path)
    return any(
        entry == file or fnmatch.fnmatchcase(f"{file}::{name}", entry) for entry in SLOW_TESTS
    )


def pytest_collection_modifyitems(config, items):
    """Marks the slow tier, then moves the files that hold slow tests to the front.

    pytest-xdist's `--dist load` hands each worker runs of consecutive tests, the last ones
    in small runs as the queue empties: with the slow files first, the run ends on
    sub-second tests that even out the two workers, not on a 50-second test one worker
    starts when the other has nothing left. Each file stays together (and in its order),
    so a module-scoped fixture (a trained run) is still built once per worker.
    """
    slow_files = set()
    for item in items:
        if is_slow(str(item.path), item.originalname):
            item.add_marker(pytest.mark.slow)
            slow_files.add(item.path)
    items.sort(key=lambda item: item.path not in slow_files)  # a stable sort


@pytest.fixture(scope="session")
def digits_dir(tmp_path_factory):
    """A TFDS data_dir holding the prepared bundled digits."""
    import loops_data as data

    directory = str(tmp_path_factory.mktemp("tfds"))
    data.load_builder("digits", directory)
    return directory


def tiny_examples(count=21, seed=0):
    """`count` random 8x8x1 uint8 images with labels 0-9."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(count, 8, 8, 1), dtype=np.uint8)
    labels = rng.integers(0, 10, size=(count,), dtype=np.int64)
    return images, labels


def slice_update_context(strategy, slice_gradients):
    """An UpdateContext on `strategy` (made in its scope) whose Updates compute their slices
    through `slice_gradients`, as in the exact parameter-server mode."""
    return loops.UpdateContext(
        strategy=strategy,
        global_step=tf.Variable(0, dtype=tf.int64, trainable=False),
        nonfinite=loops.NonFiniteUpdates(strategy, skips=False),
        slice_gradients=slice_gradients,
    )


def tiny_batches(global_batch_size=8, count=21, seed=0, shuffle_seed=None):
    """A function building one epoch of global batches of `tiny_examples`."""
    images, labels = tiny_examples(count, seed)

    def make():
        dataset = tf.data.Dataset.from_tensor_slices((images, labels))
        if shuffle_seed is not None:
            dataset = dataset.shuffle(count, seed=shuffle_seed, reshuffle_each_iteration=True)
        return dataset.batch(global_batch_size)

    return make


def failing_at_batch(failing, global_batch_size=8):
    """`tiny_batches`, endless; batch `failing` raises OSError in its Python reader (as a
    file that no longer reads would)."""
    batches = tiny_batches(global_batch_size)

    def read(index):
        if index == failing:
            raise OSError(f"batch {index} no longer reads")
        return index

    def checked(index, batch):
        read_index = tf.numpy_function(read, [index], tf.int64, stateful=True)
        with tf.control_dependencies([read_index]):
            return tf.identity(batch[0]), batch[1]

    return lambda: batches().repeat().enumerate().map(checked)


def optimizer_factory(name, learning_rate=0.05):
    if name == "sgd_momentum":
        return lambda: keras.optimizers.SGD(learning_rate, momentum=0.9)
    if name == "adam":
        return lambda: keras.optimizers.Adam(learning_rate * 0.1)
    if name == "adam_eps3":
        # Batch norm makes the loss invariant to the scale of the kernel before
        # it, so some gradient entries are zero in exact arithmetic and pure
        # rounding noise (1e-9) in float32. Adam turns noise into an update of
        # about lr * g / (|g| + epsilon): with epsilon 1e-7 that update differs
        # between any two summation orders, replicas or not. 1e-3 keeps it tiny.
        return lambda: keras.optimizers.Adam(learning_rate * 0.1, epsilon=1e-3)
    raise ValueError(name)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUBPROCESS_ENV = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def run_module(module, *argv, timeout=900):
    """Runs `python -m module argv...` from the repository root; returns the CompletedProcess."""
    return _run_python_with("-m", module, *argv, timeout=timeout)


def run_python(code, *argv, timeout=300, cwd=ROOT):
    """Runs `python -c code argv...` with loops importable; returns the CompletedProcess."""
    return _run_python_with("-c", code, *argv, timeout=timeout, cwd=cwd)


def _run_python_with(*arguments, timeout, cwd=ROOT):
    return subprocess.run(
        [sys.executable, *arguments],
        capture_output=True,
        text=True,
        env=SUBPROCESS_ENV,
        timeout=timeout,
        cwd=cwd,
    )


def built_once_for_all_workers(tmp_path_factory, name, build):
    """The folder `build(folder)` filled, built by the first pytest-xdist worker to ask.

    A module fixture runs once per worker that gets a test of its module, and `--dist load`
    may give both workers some: the other worker waits on a lock and reads the same folder
    (what it needs must be files there), rather than running the same subprocesses again.
    """
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the folder every worker's basetemp is in
    folder = os.path.join(str(base), f"shared-{name}")
    with open(folder + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not os.path.exists(os.path.join(folder, ".built")):
            shutil.rmtree(folder, ignore_errors=True)
            os.makedirs(folder)
            build(folder)
            open(os.path.join(folder, ".built"), "w").close()
    return folder


def run_logged(command, log_prefix, timeout=900):
    """Runs `command` (argv) from the repository root with loops importable, its stdout and
    stderr in files `log_prefix`.out and .err (read back with `logged_run`)."""
    with open(log_prefix + ".out", "w") as out, open(log_prefix + ".err", "w") as err:
        process = subprocess.run(
            command,
            stdout=out,
            stderr=err,
            text=True,
            env=SUBPROCESS_ENV,
            cwd=ROOT,
            timeout=timeout,
        )
    with open(log_prefix + ".code", "w") as code:
        code.write(str(process.returncode))


def logged_run(log_prefix):
    """The CompletedProcess of a `run_logged` run, from its files."""
    texts = []
    for kind in ("code", "out", "err"):
        with open(f"{log_prefix}.{kind}") as stream:
            texts.append(stream.read())
    return subprocess.CompletedProcess([], int(texts[0]), texts[1], texts[2])


# A binary run in this process (`python -c KILLED_AFTER_CHECKPOINT module flags...`) that
# SIGKILLs itself as the first executor call after its checkpoint of step KILL_AFTER_STEP (or a
# later one) starts. Counted in checkpoints, not calls: how many calls a run makes depends on
# its speed (a call ends early for a progress line every --progress_every_seconds).
KILLED_AFTER_CHECKPOINT = """
import importlib, os, signal, sys
import tensorflow as tf
from loops.definition import executors
model_dir = [a.split("=", 1)[1] for a in sys.argv if a.startswith("--model_dir=")][-1]
run = executors.Executor.run
def killing(self, *args, **kwargs):
    newest = tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints"))
    if newest and int(newest.rsplit("-", 1)[-1]) >= int(os.environ["KILL_AFTER_STEP"]):
        os.kill(os.getpid(), signal.SIGKILL)
    return run(self, *args, **kwargs)
executors.Executor.run = killing
module, sys.argv = sys.argv[1], sys.argv[1:]
importlib.import_module(module).run()
"""


def binary_run(module, flags, *, kill_after=None, timeout=600):
    """`python -m module flags...` from the repository root, or with `kill_after` the same
    run SIGKILLed as its first executor call after the checkpoint of that step starts (the
    flags name a fresh --model_dir); the CompletedProcess."""
    env = dict(SUBPROCESS_ENV)
    command = [sys.executable, "-m", module, *flags]
    if kill_after is not None:
        env["KILL_AFTER_STEP"] = str(kill_after)
        command = [sys.executable, "-c", KILLED_AFTER_CHECKPOINT, module, *flags]
    return subprocess.run(
        command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout
    )


def final_weights(model_dir):
    """The model's and optimizer's variables in the newest checkpoint of a run's model_dir."""
    path = tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints"))
    reader = tf.train.load_checkpoint(path)
    return {
        name: reader.get_tensor(name)
        for name in reader.get_variable_to_shape_map()
        if "model" in name or "optimizer" in name
    }


def read_results(model_dir):
    """The results.json a run wrote into model_dir."""
    with open(os.path.join(model_dir, "results.json")) as stream:
        return json.load(stream)


# TensorFlow's count of the saves a tf.train.Checkpoint made in its process: a resumed run
# counts from the restored value plus its own saves (6 against 3 uninterrupted), while
# every tensor the run trains and steps on is equal. The one key comparisons leave out.
SAVE_COUNTER_KEY = "save_counter/.ATTRIBUTES/VARIABLE_VALUE"


def checkpoint_weights(model_dir):
    """Every numeric variable value in the newest checkpoint of a run's model_dir, by
    checkpoint key, but TensorFlow's `SAVE_COUNTER_KEY` (and the string records: recoveries,
    the exact-only settings, JSON)."""
    reader = tf.train.load_checkpoint(os.path.join(model_dir, "checkpoints"))
    dtypes = reader.get_variable_to_dtype_map()
    return {
        name: reader.get_tensor(name)
        for name in reader.get_variable_to_shape_map()
        if "/.ATTRIBUTES/VARIABLE_VALUE" in name
        and name != SAVE_COUNTER_KEY
        and dtypes[name] != tf.string
    }


class Counter(loops.Loop):
    """Counts its steps in a variable (its output `total`): a definition that needs no data."""

    needs_train_data = False

    def build(self):
        self.total = tf.Variable(
            0.0, trainable=False, aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA
        )

    def checkpoint_items(self):
        return {"total": self.total}

    def train_step(self, iterator):
        self.total.assign_add(1.0)
        return {"total": loops.Last(self.total.read_value())}


class OneWeight(loops.Loop):
    """One Dense weight w = 1 (no bias), trained by SGD on loss = w * mean(x) over the global
    batch (plus l2 * w**2 where given): its gradient is mean(x) (+ 2 * l2 * w) on any split."""

    def __init__(self, *, clip_norm=None, learning_rate=1.0, l2=None):
        self.clip_norm, self.learning_rate, self.l2 = clip_norm, learning_rate, l2

    def build(self):
        regularizer = None if self.l2 is None else keras.regularizers.L2(self.l2)
        dense = keras.layers.Dense(
            1, use_bias=False, kernel_initializer="ones", kernel_regularizer=regularizer
        )
        self.model = keras.Sequential([keras.Input((1,)), dense])
        self.optimizer = keras.optimizers.SGD(self.learning_rate)
        self.optimizer.build(self.model.trainable_variables)
        self.update = loops.Update(self, self.optimizer, self.model, clip_norm=self.clip_norm)

    def checkpoint_items(self):
        return {"model": self.model}

    def _replica_loss(self, x):
        count = loops.global_count(tf.shape(x)[0])
        return loops.scale_to_global_batch(tf.reshape(self.model(x), [-1]), count), {}

    def train_step(self, iterator):
        result = self.update(self._replica_loss, args=(next(iterator),))
        return {"loss": loops.Mean(result.sums["loss"]), **result.outputs}


def make_trainer(definition_class, /, *args, **arguments):
    """`loops.Trainer(definition_class(*args, ...), ...)`, the keyword arguments split between
    the definition and the Trainer by the Trainer's arguments and settings (for tests'
    factories that take both)."""
    import inspect

    from loops.definition.removed_api import TRAINER_KEYWORDS

    # A keyword both take (global_batch_size: a retrieval loss's and the Trainer's) goes to both.
    takes = inspect.signature(definition_class).parameters
    run = {name: value for name, value in arguments.items() if name in TRAINER_KEYWORDS}
    own = {
        name: value
        for name, value in arguments.items()
        if name not in TRAINER_KEYWORDS or name in takes
    }
    return loops.Trainer(definition_class(*args, **own), **run)


class OutputRun:
    """A subprocess whose merged output lines are collected by a thread as they come."""

    def __init__(self, command, env):
        self.process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=ROOT,
        )
        self.lines = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.process.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def output(self):
        return "\n".join(self.lines)

    def wait_for(self, pattern, timeout=120):
        """Returns the match of the first output line matching `pattern`."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in self.lines:
                    match = re.search(pattern, line)
                    if match:
                        return match
                assert self._reader.is_alive(), (
                    f"the run ended (exit code {self.process.poll()}) with no line matching "
                    f"{pattern!r}:\n{self.output[-3000:]}"
                )
                left = deadline - time.monotonic()
                assert left > 0, (
                    f"no line matching {pattern!r} in {timeout} s:\n{self.output[-3000:]}"
                )
                self._changed.wait(min(left, 1.0))

    def finish(self, timeout=180):
        """Waits for the end; returns the exit code."""
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise
        self._reader.join(timeout=10)
        return code

    def succeed(self, timeout=180):
        code = self.finish(timeout)
        assert code == 0, f"exit code {code}:\n{self.output[-4000:]}"
        return self


def snapshot(directory) -> dict[str, tuple[bytes, int]]:
    """Relative path -> (bytes, mtime_ns) of every file under `directory`."""
    files = {}
    for parent, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(parent, name)
            with open(path, "rb") as stream:
                files[os.path.relpath(path, directory)] = (stream.read(), os.stat(path).st_mtime_ns)
    return files
