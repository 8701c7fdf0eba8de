"""DCP's options as ckpt.torch takes them: planners, storage writers and readers, async_save's
stager and executor. Each option is honoured, accepted with a documented different meaning, or
refused with ckpt.Unimplemented / ckpt.InvalidArgument naming it; none is ignored silently.
(The table in docs/python.md, "ckpt.torch and DCP", lists them.)"""

from ckpt import errors as _errors


def _dcp():
    import torch.distributed.checkpoint as dcp

    return dcp


class LoadOptions:
    """What a load planner asks of ckpt.torch.load: ``allow_partial_load`` (keys of the state
    dict the checkpoint lacks are left as they are, instead of ckpt.NotFound)."""

    def __init__(self, allow_partial_load=False):
        self.allow_partial_load = allow_partial_load


def save_planner(planner, what):
    """Accepts None or DCP's own DefaultSavePlanner: its options change nothing ckpt stores or
    loads (flatten_state_dict, flatten_sharded_tensors: ckpt always stores dotted keys and each
    shard as a piece with its offsets; dedup_replicated_tensors, dedup_save_to_lowest_rank:
    ckpt writes each replicated element once, from the lowest rank holding it;
    enable_plan_caching: ckpt's coordinator reuses plans of unchanged saves anyway). Any other
    planner (a subclass too: it may override what is saved) is refused naming its class."""
    if planner is None:
        return
    if type(planner) is not _dcp().DefaultSavePlanner:
        _refuse_planner(planner, what)


def load_planner(planner, what):
    """LoadOptions from None or DCP's own DefaultLoadPlanner (``allow_partial_load`` honoured;
    flatten_state_dict, flatten_sharded_tensors change nothing ckpt loads). Any other planner
    is refused naming its class."""
    if planner is None:
        return LoadOptions()
    if type(planner) is not _dcp().DefaultLoadPlanner:
        _refuse_planner(planner, what)
    return LoadOptions(allow_partial_load=bool(getattr(planner, "allow_partial_load", False)))


def _refuse_planner(planner, what):
    cls = type(planner)
    raise _errors.Unimplemented(
        f"{what}: planner={cls.__module__}.{cls.__qualname__} is not supported: ckpt plans "
        "reads and writes on its coordinator and cannot run a custom planner's plans; pass "
        "planner=None or DCP's DefaultSavePlanner()/DefaultLoadPlanner()")


def storage_path(storage, what):
    """The directory of DCP's FileSystemWriter / FileSystemReader, after its options are
    checked. Other storage objects, subclasses of those included, are refused naming their
    class."""
    dcp = _dcp()
    from torch.distributed.checkpoint import filesystem

    cls = type(storage)
    name = f"{cls.__module__}.{cls.__qualname__}"
    if cls in (dcp.FileSystemWriter, filesystem._FileSystemWriter):
        _check_writer(storage, what)
    elif cls is not dcp.FileSystemReader:  # a subclass (fsspec's, say) may store elsewhere
        kind = "storage_writer" if "save" in what else "storage_reader"
        raise _errors.Unimplemented(
            f"{what}: {kind}={name} is not supported: ckpt's workers write and read the "
            "checkpoint themselves, to a local directory; pass checkpoint_id or DCP's "
            "FileSystemWriter/FileSystemReader(path)")
    elif _has_extensions(getattr(storage, "transforms", None)):
        raise _errors.Unimplemented(f"{what}: storage_reader {name} with _extension_registry "
                                    "(stream transforms) is not supported by ckpt")
    path = getattr(storage, "path", None)
    if path is None:
        raise _errors.InvalidArgument(f"{what}: {name} carries no path")
    return str(path)


def _has_extensions(transforms):
    for attr in ("extensions",):
        if transforms is not None and getattr(transforms, attr, None):
            return True
    return False


def writer_overwrite(writer):
    """Whether a save through ``writer`` (None, or a FileSystemWriter storage_path accepted)
    may replace a committed ckpt checkpoint: FileSystemWriter's ``overwrite`` (True by default,
    as DCP). Without a writer, False."""
    if writer is None:
        return False
    return bool(getattr(writer, "overwrite", False))


def _check_writer(writer, what):
    """FileSystemWriter's options: single_file_per_rank, thread_count, per_thread_copy_ahead,
    cache_staged_state_dict, serialization_format choose DCP's own file layout and threads and
    have no meaning for ckpt's (documented); sync_files=False is overruled (ckpt always syncs
    before its commit); overwrite (True by default) is honoured for a ckpt checkpoint at the path
    (replaced atomically at the commit, writer_overwrite), never for anything else there (a DCP
    checkpoint, other files: refused naming the path). Stream transforms (_extensions) are
    refused."""
    if _has_extensions(getattr(writer, "transforms", None)):
        raise _errors.Unimplemented(
            f"{what}: storage_writer {type(writer).__name__} with _extensions (stream "
            "transforms such as compression) is not supported by ckpt")


def async_options(async_checkpointer_type, async_stager, storage_writer, use_collectives, what):
    """Checks async_save's options; returns whether DCP would return an AsyncSaveResponse
    (a stager staging asynchronously) rather than a Future.

    async_checkpointer_type THREAD and PROCESS are both accepted: ckpt's worker daemon writes
    either way, in a process of its own. async_stager: None or DCP's DefaultStager (any
    StagingOptions: ckpt copies into its own shared staging before async_save returns), or a
    FileSystemWriter given as storage_writer (DCP's BlockingAsyncStager). Others are refused."""
    from torch.distributed.checkpoint import staging
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

    refuse_no_collectives(use_collectives, what)
    if async_checkpointer_type not in (AsyncCheckpointerType.THREAD,
                                       AsyncCheckpointerType.PROCESS):
        raise _errors.InvalidArgument(f"{what}: async_checkpointer_type="
                                      f"{async_checkpointer_type!r} is not an "
                                      "AsyncCheckpointerType")
    if async_stager is None:
        return False
    if type(async_stager) is staging.DefaultStager:
        options = getattr(async_stager, "_config", None)
        return bool(getattr(options, "use_async_staging", False))
    if async_stager is storage_writer and isinstance(async_stager, staging.BlockingAsyncStager):
        return False
    cls = type(async_stager)
    raise _errors.Unimplemented(
        f"{what}: async_stager={cls.__module__}.{cls.__qualname__} is not supported: ckpt "
        "stages into its own shared memory before async_save returns; pass async_stager=None "
        "or DCP's DefaultStager")


def refuse_no_collectives(use_collectives, what):
    if not use_collectives:
        raise _errors.Unimplemented(
            f"{what}: use_collectives=False is not supported: ckpt's ranks agree on every save "
            "(the coordinator commits one checkpoint for all of them); DCP's rank-local "
            "metadata format has no ckpt counterpart")
