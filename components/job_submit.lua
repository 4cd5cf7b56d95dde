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
  * a node range (-N 1-8) whose maximum exceeds MaxNodes: a refusal, not a clamp. Slurm would start
    the job on its minimum, but the partition metric the scaler reads is the range's maximum
    (src/slurmctld/statistics.c jobs_max_job_nodes_nohold): a clamped range still asks for MaxNodes
    pods, and the user's range silently changes meaning;
  * CPUs, memory or GPUs on one node beyond what the worker instance type has (NODE_CPUS,
    NODE_MEMORY_MB, GPUS_PER_NODE below, rendered by components/slinky.py job_submit_script from
    core/instance_types.py): -c, --ntasks-per-node, --mincpus, -n on -N, --mem, --mem-per-cpu,
    --mem-per-gpu; with no -N, -n sizes the job to the nodes its CPUs need;
  * a GPU type no node has (--gpus=a100:1, --gres=gpu:nosuchtype:1): the nodes say GPU_TYPES;
  * --nodelist or --exclude: a note, not a refusal. slurmd pods are dynamic nodes that exist only
    while running, so at 0 pods Slurm answers "Invalid node name specified" for a name that will exist.
slurm_job_modify applies the same checks to what `scontrol update` changes (NumNodes, TimeLimit,
TresPerJob/TresPerNode, NumCPUs, MinCPUsNode, MinMemoryNode/CPU, Partition), read against the job
record for what it leaves alone: job_submit_lua.c job_modify pushes the update request (the fields an
update leaves alone are NO_VAL or nil) and the job record (src/lua/slurm_lua.c
slurm_lua_job_record_field: min_nodes, max_nodes, partition, time_limit, tres_per_*), both at
slurm-25-11-6-1 and slurm-26-05-0-1. It also prints a note when Slurm's answer at 0 nodes misleads:
slurmctld tries to start a pending job after every update, and with no node registered answers
"Requested partition configuration not available now" and exit 1 although the change (a release
too) was applied (seen on slurmctld 26.05.5, tests/engines/test_job_shapes.py).
The user `nobody` (uid 65534 in the Debian-based Slurm image, base-passwd) submits nothing and changes
nothing: it is the runnable-jobs exporter's token user (components/runnable_exporter.py), which only
reads the job list, so a leaked token cannot queue work. A refusal (ESLURM_ACCESS_DENIED).
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

-- Parameters: components/slinky.py job_submit_script renders them from the stack's worker type.
local GPUS_PER_NODE = 1
local NODE_CPUS = 4
local NODE_MEMORY_MB = 14745
local GPU_TYPES = "tesla"
local WORKER_TYPE = "g4dn.xlarge"
-- How to raise the limit a refusal names: the NodeSet's largest size follows these settings,
-- MaxTime is the other, the node's shape the worker type.
local LIMIT_SETTINGS = "settings workerCount, aiGuaranteedGpus, hpcBorrowsAiGpus, kedaMaxReplicas"
local TIME_SETTING = "setting slurmJobMaxMinutes"
local SHAPE_SETTING = "setting workerInstanceType"
-- The runnable-jobs exporter's token user (components/runnable_exporter.py TOKEN_USER), read-only.
local READ_ONLY_UID = 65534
local READ_ONLY_USER = "nobody"
-- slurm.h's NO_VAL16, the unset value of 16-bit fields (cpus_per_task, ntasks_per_node, pn_min_cpus).
local NO_VAL16 = 65534

-- The GPU count of a TRES string: entries separated by commas, each "gres/gpu", "gres/gpu:N",
-- "gres/gpu=N", "gres/gpu:<type>:N" or "gres/gpu:<type>=N", summed. nil: no GPUs asked.
-- The second result is the first GPU type no node has, or nil.
local function gpu_count(tres)
	if tres == nil then
		return nil, nil
	end
	local total, unknown = nil, nil
	for entry in string.gmatch(tres, "[^,]+") do
		local spec = entry:gsub("^gres[/:]", "")
		local name = spec:match("^[^:=]+")
		if name == "gpu" then
			local count = tonumber(spec:match("[:=](%d+)$") or "1")
			local kind = spec:match("^gpu:([^:=]+)[:=]%d+$") or spec:match("^gpu:(%a[^:=]*)$")
			if kind ~= nil and unknown == nil then
				local known = false
				for t in string.gmatch(GPU_TYPES, "[^,]+") do
					known = known or t == kind
				end
				if not known then
					unknown = kind
				end
			end
			total = (total or 0) + count
		end
	end
	return total, unknown
end

local function is_set(value)
	return value ~= nil and value ~= slurm.NO_VAL and value ~= slurm.INFINITE and value ~= NO_VAL16
end

-- The job's partitions: those it names, or the default one (flag_default) when it names none.
local function partitions(partition, part_list)
	local found = {}
	if partition == nil then
		for name, part in pairs(part_list) do
			if part.flag_default ~= 0 then
				found[#found + 1] = { name = name, record = part }
			end
		end
	else
		for name in string.gmatch(partition, "[^,]+") do
			if part_list[name] ~= nil then
				found[#found + 1] = { name = name, record = part_list[name] }
			end
		end
	end
	return found
end

-- A refusal when `nodes` exceeds the configured MaxNodes of one of the job's partitions.
local function over_limit(partition, part_list, nodes, what)
	for _, p in ipairs(partitions(partition, part_list)) do
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

-- A refusal when a time limit exceeds the configured MaxTime of one of the job's partitions.
-- INFINITE (--time=0 or UNLIMITED) exceeds every finite MaxTime.
local function over_time(asked, partition, part_list)
	if asked == nil or asked == slurm.NO_VAL then
		return false
	end
	for _, p in ipairs(partitions(partition, part_list)) do
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

-- A refusal for what one node must hold beyond the worker type's.
local function over_node(asked, have, unit, what)
	if asked ~= nil and asked > have then
		slurm.log_user(
			"testbed: %s asks %d %s on one node, but each node (slurmd pod on a %s) has %d (%s)",
			what,
			asked,
			unit,
			WORKER_TYPE,
			have,
			SHAPE_SETTING
		)
		return true
	end
	return false
end

local function refuse_gpu_type(kind)
	slurm.log_user(
		"testbed: GPU type %s: no node has it, every node's GPU is type %s (%s); ask --gpus=N without a type",
		kind,
		GPU_TYPES,
		SHAPE_SETTING
	)
	return slurm.ESLURM_INVALID_GRES
end

-- GPUs asked on each node: --gpus-per-node and --gres (tres_per_node), or --gpus-per-socket times
-- the sockets per node (at least one); and the first unknown GPU type of either.
local function gpus_per_node(job)
	local per_node, unknown = gpu_count(job.tres_per_node)
	local per_socket, unknown_socket = gpu_count(job.tres_per_socket)
	if per_socket ~= nil then
		local sockets = is_set(job.sockets_per_node) and job.sockets_per_node or 1
		per_node = math.max(per_node or 0, per_socket * sockets)
	end
	return per_node, unknown or unknown_socket
end

-- The job's GPUs in all (--gpus, or --gpus-per-task times the tasks), and the first unknown type.
local function gpus_total(job)
	local gpus, unknown = gpu_count(job.tres_per_job)
	local per_task, unknown_task = gpu_count(job.tres_per_task)
	if gpus == nil and per_task ~= nil then
		local tasks = is_set(job.num_tasks) and job.num_tasks or 1
		gpus = per_task * tasks
	end
	if gpus == 0 then
		gpus = nil
	end
	return gpus, unknown or unknown_task
end

-- The GPUs a request asks for in all (nil: none said), or the error that refuses it: a type no node
-- has, or more per node than a node holds. `total` says how to ask for a total instead, in the
-- words of sbatch or of scontrol update.
local function requested_gpus(job_desc, total)
	local per_node, unknown_node = gpus_per_node(job_desc)
	local gpus, unknown_job = gpus_total(job_desc)
	if unknown_node or unknown_job then
		return nil, refuse_gpu_type(unknown_node or unknown_job)
	end
	if per_node ~= nil and per_node > GPUS_PER_NODE then
		slurm.log_user(
			"testbed: %d GPUs per node asked, but each node (slurmd pod) has %d; ask %s instead",
			per_node,
			GPUS_PER_NODE,
			total
		)
		return nil, slurm.ESLURM_INVALID_GRES
	end
	return gpus, nil
end

-- What one node must hold, refused when over the worker type: CPUs (-c, --ntasks-per-node,
-- --mincpus, -n spread over `nodes`), memory (--mem, --mem-per-cpu times those CPUs, --mem-per-gpu).
-- `nodes`: the most nodes the job may use (nil: unknown, the CPUs then spread as Slurm chooses).
local function over_shape(job, nodes)
	local per_task = is_set(job.cpus_per_task) and job.cpus_per_task or 1
	local cpus = 0
	if is_set(job.cpus_per_task) then
		cpus = per_task
	end
	if is_set(job.ntasks_per_node) then
		cpus = math.max(cpus, job.ntasks_per_node * per_task)
	end
	if is_set(job.pn_min_cpus) then
		cpus = math.max(cpus, job.pn_min_cpus)
	end
	if nodes ~= nil and is_set(job.num_tasks) then
		cpus = math.max(cpus, math.ceil(job.num_tasks / nodes) * per_task)
	end
	if over_node(cpus > 0 and cpus or nil, NODE_CPUS, "CPUs", "the job") then
		return true
	end
	if is_set(job.min_mem_per_node) and over_node(job.min_mem_per_node, NODE_MEMORY_MB, "MB", "--mem") then
		return true
	end
	if is_set(job.min_mem_per_cpu) then
		local mem = job.min_mem_per_cpu * math.max(cpus, per_task)
		if over_node(mem, NODE_MEMORY_MB, "MB", "--mem-per-cpu times its CPUs per node") then
			return true
		end
	end
	local per_gpu = job.mem_per_tres and tonumber(job.mem_per_tres:match("gres/gpu[^,]*:(%d+)"))
	if per_gpu ~= nil and over_node(per_gpu * GPUS_PER_NODE, NODE_MEMORY_MB, "MB", "--mem-per-gpu") then
		return true
	end
	return false
end

-- The nodes -n needs when no -N is given: its CPUs over the node's (1 when it fits on one).
local function task_nodes(job)
	if not is_set(job.num_tasks) then
		return nil
	end
	local per_task = is_set(job.cpus_per_task) and job.cpus_per_task or 1
	local per_node = math.floor(NODE_CPUS / per_task)
	if is_set(job.ntasks_per_node) then
		per_node = math.min(per_node, job.ntasks_per_node)
	end
	return math.ceil(job.num_tasks / math.max(per_node, 1))
end

-- The note for --nodelist/--exclude naming nodes, which at 0 slurmd pods do not exist.
local function note_node_names(job)
	if job.req_nodes ~= nil or job.exc_nodes ~= nil then
		slurm.log_user(
			"testbed: --nodelist/--exclude name slurmd pods, which exist as Slurm nodes only while running; if Slurm answers 'Invalid node name specified', that pod is not running now: drop the option and let the scaler start one"
		)
	end
end

-- The read-only user: a refusal naming it, for a submission or an update alike.
local function read_only(uid)
	if uid == READ_ONLY_UID then
		slurm.log_user(
			"testbed: user %s only reads the job list (the runnable-jobs exporter's token); it may not submit or change jobs",
			READ_ONLY_USER
		)
		return true
	end
	return false
end

function slurm_job_submit(job_desc, part_list, submit_uid)
	if read_only(submit_uid) then
		return slurm.ESLURM_ACCESS_DENIED
	end
	local partition = job_desc.partition
	note_node_names(job_desc)
	if over_time(job_desc.time_limit, partition, part_list) then
		return slurm.ESLURM_INVALID_TIME_LIMIT
	end
	local gpus, refused = requested_gpus(job_desc, "--gpus=<total>")
	if refused then
		return refused
	end
	local nodes = gpus and math.ceil(gpus / GPUS_PER_NODE)

	if is_set(job_desc.min_nodes) then
		-- An explicit -N (or a range): kept, unless it can never run.
		local most = job_desc.min_nodes
		if is_set(job_desc.max_nodes) and job_desc.max_nodes > most then
			most = job_desc.max_nodes
		end
		local asked = most == job_desc.min_nodes and string.format("-N %d", most)
			or string.format("-N %d-%d", job_desc.min_nodes, most)
		if over_limit(partition, part_list, most, asked) then
			return slurm.ESLURM_INVALID_NODE_COUNT
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
		if over_shape(job_desc, most) then
			return slurm.ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE
		end
		return slurm.SUCCESS
	end
	local by_tasks = task_nodes(job_desc)
	if by_tasks ~= nil and (nodes == nil or by_tasks > nodes) and by_tasks > 1 then
		nodes = by_tasks
	end
	if nodes ~= nil and over_limit(partition, part_list, nodes, gpus and string.format("%d GPUs", gpus) or string.format("%d tasks", job_desc.num_tasks)) then
		return slurm.ESLURM_INVALID_NODE_COUNT
	end
	if over_shape(job_desc, nodes) then
		return slurm.ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE
	end
	if nodes == nil then
		return slurm.SUCCESS
	end
	job_desc.min_nodes = nodes
	job_desc.max_nodes = nodes
	slurm.log_info("testbed: job of uid %d sized to %d nodes", submit_uid, nodes)
	return slurm.SUCCESS
end

-- An update (scontrol update): the same checks on what it changes, against the job record for the
-- rest. The request's unset fields are NO_VAL (numbers) or nil (strings).
function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
	if read_only(modify_uid) then
		return slurm.ESLURM_ACCESS_DENIED
	end
	local partition = job_desc.partition or job_rec.partition
	note_node_names(job_desc)
	local time_limit = job_desc.time_limit
	if not is_set(time_limit) and time_limit ~= slurm.INFINITE and job_desc.partition ~= nil then
		time_limit = job_rec.time_limit
	end
	if over_time(time_limit, partition, part_list) then
		return slurm.ESLURM_INVALID_TIME_LIMIT
	end
	local gpus, refused = requested_gpus(job_desc, "TresPerJob=gres/gpu:<total>")
	if refused then
		return refused
	end
	local min_nodes = is_set(job_desc.min_nodes) and job_desc.min_nodes or job_rec.min_nodes
	local most = is_set(job_desc.max_nodes) and job_desc.max_nodes or (is_set(job_desc.min_nodes) and job_desc.min_nodes)
	if not most then
		most = math.max(job_rec.max_nodes or 0, job_rec.min_nodes or 1)
	end
	most = math.max(most, min_nodes or 1)
	if is_set(job_desc.min_nodes) or is_set(job_desc.max_nodes) or job_desc.partition ~= nil then
		if over_limit(partition, part_list, most, string.format("NumNodes=%d", most)) then
			return slurm.ESLURM_INVALID_NODE_COUNT
		end
	end
	if gpus ~= nil then
		local need = math.ceil(gpus / GPUS_PER_NODE)
		if over_limit(partition, part_list, need, string.format("%d GPUs", gpus)) then
			return slurm.ESLURM_INVALID_NODE_COUNT
		end
		if is_set(job_desc.min_nodes) or is_set(job_desc.max_nodes) then
			if most * GPUS_PER_NODE < gpus then
				slurm.log_user(
					"testbed: %d GPUs on at most %d node(s) can never run: each node (slurmd pod) has %d GPU; ask NumNodes=%d",
					gpus,
					most,
					GPUS_PER_NODE,
					need
				)
				return slurm.ESLURM_INVALID_NODE_COUNT
			end
		else
			-- As at submit, a GPU count sizes the job: one node per GPU.
			job_desc.min_nodes = need
			job_desc.max_nodes = need
			most = need
		end
	end
	if is_set(job_desc.min_cpus) and over_node(math.ceil(job_desc.min_cpus / most), NODE_CPUS, "CPUs", "NumCPUs") then
		return slurm.ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE
	end
	if over_shape(job_desc, nil) then
		return slurm.ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE
	end
	if job_desc.priority == slurm.INFINITE then
		slurm.log_user(
			"testbed: released; if no slurmd pod runs yet, Slurm adds 'Requested partition configuration not available now' and exit 1 though the release was applied: the scaler starts a pod"
		)
	end
	return slurm.SUCCESS
end

return slurm.SUCCESS
