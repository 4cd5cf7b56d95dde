--[[
job_submit.lua: slurmctld's job_submit/lua plugin for the GPU testbed (JobSubmitPlugins=lua).

Every slurmd pod has one GPU (components/names.py GPUS_PER_WORKER), so a GPU count is a node count.
Without this script `sbatch --gpus=2` (no -N) is a 1-node job: sbatch leaves min_nodes unset
(SchedMD/slurm@slurm-25-11-0-1:src/common/slurm_opt.c slurm_opt_create_job_desc), slurmctld makes it
min 1, max 0 (src/slurmctld/job_mgr.c), and the partition metric KEDA scales on, MAX(max_nodes,
min_nodes) (src/slurmctld/statistics.c), asks for one slurmd pod, on which the job never starts.

What the script does, for a job in any partition (every node of this cluster is a one-GPU slurmd pod):
  * --gpus=N (or --gpus-per-task=G with -n T: N = G*T) and no -N: min_nodes = max_nodes = N, or a
    refusal when N exceeds the MaxNodes of one of the job's partitions;
  * --gpus=N with a -N whose largest node count holds fewer than N GPUs: a refusal (it never runs);
  * --gpus-per-node / --gres=gpu:K with K > 1: a refusal (no node has K GPUs).
A refusal prints the reason on the user's terminal (slurm.log_user; the client prints it as an
error, src/common/slurm_protocol_pack.c) followed by the Slurm error of the return code.

The job_desc fields read and set here, and the partition records (max_nodes, flag_default), are those
of src/plugins/job_submit/lua/job_submit_lua.c; slurm.NO_VAL, slurm.INFINITE, slurm.log_user and the
slurm.ESLURM_* codes are registered by src/lua/slurm_lua.c. The testbed's twin models this file
(twin/slurm.py job_submit) and a test runs both on the same cases.
]]

local GPUS_PER_NODE = 1

-- The GPU count of a TRES string: "gres/gpu:2", "gres/gpu:tesla:2", "gres/gpu" (1), comma-separated
-- entries summed (src/common/proc_args.c xfmt_tres writes "gres/gpu:<--gpus value>"). nil: no GPUs.
local function gpu_count(tres)
	if tres == nil then
		return nil
	end
	local total = nil
	for entry in string.gmatch(tres, "[^,]+") do
		local spec = entry:gsub("^gres[/:]", "")
		local fields = {}
		for field in string.gmatch(spec, "[^:]+") do
			fields[#fields + 1] = field
		end
		if fields[1] == "gpu" then
			local count = 1
			if #fields > 1 and fields[#fields]:match("^%d+$") then
				count = tonumber(fields[#fields])
			end
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

function slurm_job_submit(job_desc, part_list, submit_uid)
	local per_node = gpu_count(job_desc.tres_per_node)
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
	if gpus == nil or gpus == 0 then
		return slurm.SUCCESS
	end
	local nodes = math.ceil(gpus / GPUS_PER_NODE)

	if is_set(job_desc.min_nodes) then
		-- An explicit -N: kept, unless its largest node count cannot hold the GPUs.
		local most = job_desc.min_nodes
		if is_set(job_desc.max_nodes) and job_desc.max_nodes > most then
			most = job_desc.max_nodes
		end
		if most * GPUS_PER_NODE < gpus then
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

	for _, p in ipairs(partitions(job_desc, part_list)) do
		local limit = p.record.max_nodes
		if is_set(limit) and nodes > limit then
			slurm.log_user(
				"testbed: %d GPUs need %d nodes (one GPU per slurmd pod); partition %s has MaxNodes=%d",
				gpus,
				nodes,
				p.name,
				limit
			)
			return slurm.ESLURM_INVALID_NODE_COUNT
		end
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
