--[[
job_submit.lua: slurmctld's job_submit/lua plugin for the GPU testbed (JobSubmitPlugins=lua).

Every slurmd pod has one GPU (core/names.py GPUS_PER_WORKER), so a GPU count is a node count.
Without this script `sbatch --gpus=2` (no -N) is a 1-node job: sbatch leaves min_nodes unset
(SchedMD/slurm@slurm-25-11-0-1:src/common/slurm_opt.c slurm_opt_create_job_desc), slurmctld makes it
min 1, max 0 (src/slurmctld/job_mgr.c), and the partition metric KEDA scales on, MAX(max_nodes,
min_nodes) (src/slurmctld/statistics.c), asks for one slurmd pod, on which the job never starts.

What the script does, for a job in any partition (every node of this cluster is a one-GPU slurmd pod).
The limits are the configured ones (the partition's MaxNodes), never the nodes registered now: Slinky
runs slurmd as dynamic nodes, so with slurmd scaled to 0 no node is registered, and slurm.conf keeps
EnforcePartLimits=NO so that slurmctld does not refuse jobs against that empty partition
(src/slurmctld/job_mgr.c _part_access_check, _valid_job_part).
  * a GPU count from --gpus=N, --gpus-per-task=G or --tres-per-task=gres/gpu:G (N = G * tasks): with
    no -N, min_nodes = max_nodes = N; with a -N whose largest node count holds fewer than N GPUs, a
    refusal (it never runs);
  * --gpus-per-node, --gres=gpu:K or --gpus-per-socket asking more than one GPU on a node: a refusal
    (no node has K GPUs);
  * a node count (-N, or the one set above) over the MaxNodes of one of the job's partitions: a
    refusal naming the limit, instead of a job that pends forever (PartitionNodeLimit);
  * a time limit (--time, minutes in job_desc.time_limit; --time=0 and UNLIMITED are INFINITE,
    src/common/slurm_opt.c arg_set_time_limit) over the MaxTime of one of the job's partitions
    (slurmJobMaxMinutes): a refusal naming the limit and the setting. Under EnforcePartLimits=NO
    slurmctld accepts such a job and never starts it: job_limits_check finds it over the partition's
    max_time (_part_access_check) and leaves it pending with reason PartitionTimeLimit
    (src/slurmctld/job_mgr.c, job_scheduler.c). A job without --time (NO_VAL) is left alone: it gets
    MaxTime when it starts, DefaultTime being unset (src/slurmctld/node_scheduler.c select_nodes).
A refusal prints the reason on the user's terminal (slurm.log_user; the client prints it as an
error, src/common/slurm_protocol_pack.c) followed by the Slurm error of the return code.

The job_desc fields read and set here, and the partition records (max_nodes: the configured MaxNodes,
max_time: the configured MaxTime in minutes, INFINITE for UNLIMITED; flag_default), are those of
src/plugins/job_submit/lua/job_submit_lua.c; slurm.NO_VAL, slurm.INFINITE, slurm.log_user and the
slurm.ESLURM_* codes are registered by src/lua/slurm_lua.c (both at slurm-25-11-6-1). Slurm records GPU
requests as TRES strings: "gres/gpu:2" (--gpus, --gpus-per-node, --gres), "gres/gpu=1"
(--gpus-per-task), "gres/gpu:tesla:2", "gres/gpu" (one). The testbed's twin models this file
(twin/slurm.py time_refusal and job_submit); a test runs both on the same cases, and the real-Slurm
tests run it inside slurmctld.
]]

local GPUS_PER_NODE = 1
-- How to raise the limit a refusal names: the NodeSet's largest size follows these settings,
-- MaxTime is the other.
local LIMIT_SETTINGS = "settings workerCount, aiGuaranteedGpus, hpcBorrowsAiGpus, kedaMaxReplicas"
local TIME_SETTING = "setting slurmJobMaxMinutes"

-- The GPU count of a TRES string: entries separated by commas, each "gres/gpu", "gres/gpu:N",
-- "gres/gpu=N", "gres/gpu:<type>:N" or "gres/gpu:<type>=N", summed. nil: no GPUs asked.
local function gpu_count(tres)
	if tres == nil then
		return nil
	end
	local total = nil
	for entry in string.gmatch(tres, "[^,]+") do
		local spec = entry:gsub("^gres[/:]", "")
		local name = spec:match("^[^:=]+")
		if name == "gpu" then
			local count = tonumber(spec:match("[:=](%d+)$") or "1")
			total = (total or 0) + count
		end
	end
	return total
end

local function is_set(value)
	return value ~= nil and value ~= slurm.NO_VAL and value ~= slurm.INFINITE
end

-- The job's partitions: those it names, or the default one (flag_default) when it names none.
local function partitions(job_desc, part_list)
	local found = {}
	if job_desc.partition == nil then
		for name, part in pairs(part_list) do
			if part.flag_default ~= 0 then
				found[#found + 1] = { name = name, record = part }
			end
		end
	else
		for name in string.gmatch(job_desc.partition, "[^,]+") do
			if part_list[name] ~= nil then
				found[#found + 1] = { name = name, record = part_list[name] }
			end
		end
	end
	return found
end

-- A refusal when `nodes` exceeds the configured MaxNodes of one of the job's partitions.
local function over_limit(job_desc, part_list, nodes, what)
	for _, p in ipairs(partitions(job_desc, part_list)) do
		local limit = p.record.max_nodes
		if is_set(limit) and nodes > limit then
			slurm.log_user(
				"testbed: %s need %d nodes (one GPU per slurmd pod); partition %s has MaxNodes=%d, the most slurmd pods this testbed runs (%s)",
				what,
				nodes,
				p.name,
				limit,
				LIMIT_SETTINGS
			)
			return true
		end
	end
	return false
end

-- A refusal when the job's time limit exceeds the configured MaxTime of one of its partitions.
-- INFINITE (--time=0 or UNLIMITED) exceeds every finite MaxTime.
local function over_time(job_desc, part_list)
	local asked = job_desc.time_limit
	if asked == nil or asked == slurm.NO_VAL then
		return false
	end
	for _, p in ipairs(partitions(job_desc, part_list)) do
		local limit = p.record.max_time
		if is_set(limit) and asked > limit then
			local what = asked == slurm.INFINITE and "no time limit (--time=0 or UNLIMITED)"
				or string.format("a time limit of %d minutes", asked)
			slurm.log_user(
				"testbed: %s is over MaxTime=%d of partition %s, the longest a Slurm job may run on this testbed (%s); ask --time=%d or less",
				what,
				limit,
				p.name,
				TIME_SETTING,
				limit
			)
			return true
		end
	end
	return false
end

-- GPUs asked on each node: --gpus-per-node and --gres (tres_per_node), or --gpus-per-socket times
-- the sockets per node (at least one).
local function gpus_per_node(job_desc)
	local per_node = gpu_count(job_desc.tres_per_node)
	local per_socket = gpu_count(job_desc.tres_per_socket)
	if per_socket ~= nil then
		local sockets = is_set(job_desc.sockets_per_node) and job_desc.sockets_per_node or 1
		per_node = math.max(per_node or 0, per_socket * sockets)
	end
	return per_node
end

function slurm_job_submit(job_desc, part_list, submit_uid)
	if over_time(job_desc, part_list) then
		return slurm.ESLURM_INVALID_TIME_LIMIT
	end
	local per_node = gpus_per_node(job_desc)
	if per_node ~= nil and per_node > GPUS_PER_NODE then
		slurm.log_user(
			"testbed: %d GPUs per node asked, but each node (slurmd pod) has %d; ask --gpus=<total> instead",
			per_node,
			GPUS_PER_NODE
		)
		return slurm.ESLURM_INVALID_GRES
	end

	local gpus = gpu_count(job_desc.tres_per_job)
	local per_task = gpu_count(job_desc.tres_per_task)
	if gpus == nil and per_task ~= nil then
		local tasks = is_set(job_desc.num_tasks) and job_desc.num_tasks or 1
		gpus = per_task * tasks
	end
	if gpus == 0 then
		gpus = nil
	end
	local nodes = gpus and math.ceil(gpus / GPUS_PER_NODE)

	if is_set(job_desc.min_nodes) then
		-- An explicit -N: kept, unless it can never run.
		if over_limit(job_desc, part_list, job_desc.min_nodes, string.format("-N %d", job_desc.min_nodes)) then
			return slurm.ESLURM_INVALID_NODE_COUNT
		end
		local most = job_desc.min_nodes
		if is_set(job_desc.max_nodes) and job_desc.max_nodes > most then
			most = job_desc.max_nodes
		end
		if gpus ~= nil and most * GPUS_PER_NODE < gpus then
			slurm.log_user(
				"testbed: %d GPUs on at most %d node(s) can never run: each node (slurmd pod) has %d GPU; drop -N or ask -N %d",
				gpus,
				most,
				GPUS_PER_NODE,
				nodes
			)
			return slurm.ESLURM_INVALID_NODE_COUNT
		end
		return slurm.SUCCESS
	end
	if gpus == nil then
		return slurm.SUCCESS
	end

	if over_limit(job_desc, part_list, nodes, string.format("%d GPUs", gpus)) then
		return slurm.ESLURM_INVALID_NODE_COUNT
	end
	job_desc.min_nodes = nodes
	job_desc.max_nodes = nodes
	slurm.log_info("testbed: %d GPUs and no -N, job of uid %d sized to %d nodes", gpus, submit_uid, nodes)
	return slurm.SUCCESS
end

-- Required by the plugin (job_submit_lua.c req_fxns). A modify (scontrol update) is left alone.
function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
	return slurm.SUCCESS
end

return slurm.SUCCESS
