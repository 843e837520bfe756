#!/usr/bin/env python3
"""Writes the DRA snapshot fixtures of crates/core/tests (NVIDIA DRA driver format).

Usage: for w in whole mig named; do hack/dra-fixtures.py $w > crates/core/tests/fixtures/dra-$w.yaml; done
"""
import json, sys
def node(name):
    return {"apiVersion":"v1","kind":"Node","metadata":{"name":name,"creationTimestamp":"2026-01-01T00:00:00Z","labels":{"kubernetes.io/hostname":name,"nvidia.com/gpu.present":"true"}},
            "status":{"allocatable":{"cpu":"64","memory":"512Gi","pods":"110"},"conditions":[{"type":"Ready","status":"True","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}
def gpu_dev(i, node):
    return {"name":f"gpu-{i}","attributes":{"type":{"string":"gpu"},"uuid":{"string":f"GPU-{node}-{i:04d}"},
            "productName":{"string":"NVIDIA A100-SXM4-80GB"},"resource.kubernetes.io/pcieRoot":{"string":f"pci0000:{i:02x}"},
            "cudaComputeCapability":{"version":"8.0.0"}},"capacity":{"memory":{"value":"80Gi"}}}
def slice_(node, devs, name=None, count=1, gen=1, counters=None):
    spec={"driver":"gpu.nvidia.com","nodeName":node,"pool":{"name":node,"generation":gen,"resourceSliceCount":count}}
    if devs is not None: spec["devices"]=devs
    if counters is not None: spec["sharedCounters"]=counters
    return {"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice","metadata":{"name":name or f"{node}-gpu.nvidia.com-x"},"spec":spec}
def classes():
    return [{"apiVersion":"resource.k8s.io/v1","kind":"DeviceClass","metadata":{"name":"gpu.nvidia.com"},
             "spec":{"selectors":[{"cel":{"expression":"device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}],
                     "extendedResourceName":"nvidia.com/gpu"}},
            {"apiVersion":"resource.k8s.io/v1","kind":"DeviceClass","metadata":{"name":"mig.nvidia.com"},
             "spec":{"selectors":[{"cel":{"expression":"device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"}}]}}]
def owner(rs): return [{"apiVersion":"apps/v1","kind":"ReplicaSet","name":rs,"uid":f"rs-{rs}","controller":True}]
def pod(ns, name, node, uid, gpus_ext=0, template=None, named=None, claim_status=None, ext_claim=None, labels=None):
    c={"name":"c","resources":{"requests":{"cpu":"1","memory":"4Gi"}}}
    if gpus_ext: c["resources"]["limits"]={"nvidia.com/gpu":str(gpus_ext)}; c["resources"]["requests"]["nvidia.com/gpu"]=str(gpus_ext)
    spec={"nodeName":node,"schedulerName":"gpu-binpack","containers":[c]}
    rcs=[]
    if template: rcs.append({"name":"gpu","resourceClaimTemplateName":template})
    if named: rcs.append({"name":"gpu","resourceClaimName":named})
    if rcs:
        spec["resourceClaims"]=rcs; c["resources"]["claims"]=[{"name":"gpu"}]
    status={"phase":"Running","conditions":[{"type":"Ready","status":"True"}],"startTime":"2026-01-01T00:00:00Z"}
    if claim_status: status["resourceClaimStatuses"]=[{"name":"gpu","resourceClaimName":claim_status}]
    if ext_claim: status["extendedResourceClaimStatus"]={"resourceClaimName":ext_claim,"requestMappings":[{"containerName":"c","resourceName":"nvidia.com/gpu","requestName":"container-0-request-0"}]}
    rs=name.rsplit("-",1)[0]
    return {"apiVersion":"v1","kind":"Pod","metadata":{"name":name,"namespace":ns,"uid":uid,"creationTimestamp":"2026-01-01T00:00:00Z","labels":labels or {"app":rs},"ownerReferences":owner(rs)},"spec":spec,"status":status}
def claim(ns, name, results, reserved, cls="gpu.nvidia.com", count=1, ext=False):
    md={"name":name,"namespace":ns}
    if ext: md["annotations"]={"resource.kubernetes.io/extended-resource-claim":"true"}
    return {"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":md,
            "spec":{"devices":{"requests":[{"name":"gpu","exactly":{"deviceClassName":cls,"count":count}}]}},
            "status":{"allocation":{"devices":{"results":[dict({"request":"gpu","driver":"gpu.nvidia.com"},**r) for r in results]},
                        "nodeSelector":{"nodeSelectorTerms":[{"matchFields":[{"key":"metadata.name","operator":"In","values":[results[0]["pool"]]}]}]}},
                      "reservedFor":[{"resource":"pods","name":n,"uid":u} for n,u in reserved]}}
def rs(name, ns="ml"):
    return {"apiVersion":"apps/v1","kind":"ReplicaSet","metadata":{"name":name,"namespace":ns,"uid":f"rs-{name}","ownerReferences":[{"apiVersion":"apps/v1","kind":"Deployment","name":name,"uid":f"d-{name}","controller":True}]},"spec":{"replicas":2}}
def out(items, header):
    import yaml
    print(header)
    print(yaml.safe_dump({"apiVersion":"v1","items":items,"kind":"List","metadata":{"resourceVersion":""}}, sort_keys=False, width=100), end="")

which=sys.argv[1]
if which=="whole":
    # 4 nodes × 8 A100, published only in ResourceSlices (one slice per node, NVIDIA static mode).
    items=[node(f"dra-{n}") for n in range(4)]
    items+=[slice_(f"dra-{n}", [gpu_dev(i, f"dra-{n}") for i in range(8)], name=f"dra-{n}-gpu.nvidia.com-abcde") for n in range(4)]
    items+=classes()
    # dra-0: 2 pods via DRA-backed nvidia.com/gpu (1 GPU each); dra-1: 1 template-claim pod (1 GPU)
    # dra-2: 5 GPUs in use; dra-3: one.
    k=0
    def ext_pod(node, gi, nm):
        global k; k+=1
        cn=f"{nm}-extended-resources-{k:05d}"
        items.append(pod("ml", nm, node, f"u-{nm}", gpus_ext=1, ext_claim=cn))
        items.append(claim("ml", cn, [{"pool":node,"device":f"gpu-{gi}"}], [(nm, f"u-{nm}")], ext=True))
    def tpl_pod(node, gi, nm):
        global k; k+=1
        cn=f"{nm}-gpu-{k:05d}"
        items.append(pod("ml", nm, node, f"u-{nm}", template="one-gpu", claim_status=cn))
        items.append(claim("ml", cn, [{"pool":node,"device":f"gpu-{gi}"}], [(nm, f"u-{nm}")]))
    ext_pod("dra-0", 3, "infer-a"); ext_pod("dra-0", 6, "infer-b")
    tpl_pod("dra-1", 0, "embed-a"); tpl_pod("dra-1", 1, "embed-b")
    for g in range(5): ext_pod("dra-2", g, f"serve-{g}")
    ext_pod("dra-3", 7, "infer-c")
    items+=[rs("infer"), rs("embed"), rs("serve")]
    # Pending 8-GPU job through the extended resource.
    p=pod("ml","train-0",None,"u-train",gpus_ext=8); del p["spec"]["nodeName"]; p["status"]={"phase":"Pending"}
    items.append(p)
    out(items, "# 4 nodes × 8 NVIDIA A100 published only in ResourceSlices (gpu.nvidia.com, static mode),\n# no nvidia.com/gpu in the nodes' allocatable: DRA-backed nvidia.com/gpu pods, two\n# template-claim pods, and a pending 8-GPU pod no node can take. Generated by hack/dra-fixtures.py in the format of\n# `kubectl get nodes,pods,replicasets,resourceslices,resourceclaims,deviceclasses -A -o yaml`.")
elif which=="mig":
    # One node, 2 A100 as partitionable devices (NVIDIA DynamicMIG layout): a counters slice,
    # one device slice per GPU. Pool of 3 slices.
    n="mig-0"
    items=[node(n)]
    counters=[]
    for g in range(2):
        cs={f"memory-slice-{i}":{"value":"1"} for i in range(8)}
        cs["multiprocessors"]={"value":"98"}
        counters.append({"name":f"gpu-{g}-counter-set","counters":cs})
    items.append(slice_(n, None, name=f"{n}-counters", count=3, gen=2, counters=counters))
    for g in range(2):
        devs=[]
        whole=gpu_dev(g, n); whole["consumesCounters"]=[{"counterSet":f"gpu-{g}-counter-set","counters":dict({f"memory-slice-{i}":{"value":"1"} for i in range(8)},multiprocessors={"value":"98"})}]
        devs.append(whole)
        def mig(profile, gi, start, size, sms, mem):
            d={"name":f"gpu-{g}-mig-{profile.replace('.','')}-{gi}-{start}","attributes":{"type":{"string":"mig"},"profile":{"string":profile},
               "parentUUID":{"string":f"GPU-{n}-{g:04d}"},"uuid":{"string":f"MIG-{n}-{g}-{profile}-{start}"},"productName":{"string":"NVIDIA A100-SXM4-80GB"}},
               "capacity":{"memory":{"value":mem},"multiprocessors":{"value":str(sms)}},
               "consumesCounters":[{"counterSet":f"gpu-{g}-counter-set","counters":dict({f"memory-slice-{i}":{"value":"1"} for i in range(start,start+size)},multiprocessors={"value":str(sms)})}]}
            return d
        for s in range(7): devs.append(mig("1g.10gb",19,s,1,14,"10Gi"))
        for s in (0,4): devs.append(mig("3g.40gb",9,s,4,42,"40Gi"))
        devs.append(mig("7g.80gb",0,0,8,98,"80Gi"))
        items.append(slice_(n, devs, name=f"{n}-gpu-{g}", count=3, gen=2))
    # An old slice of generation 1 that the driver has not deleted yet: ignored.
    items.append(slice_(n, [gpu_dev(5, n)], name=f"{n}-stale", count=1, gen=1))
    items+=classes()
    # Two 1g.10gb partitions and one 3g.40gb on gpu-0; gpu-1 whole for a template-claim pod.
    def mpod(nm, dev, cls="mig.nvidia.com"):
        cn=f"{nm}-gpu-x1"
        items.append(pod("ml", nm, n, f"u-{nm}", template="one-mig", claim_status=cn))
        items.append(claim("ml", cn, [{"pool":n,"device":dev}], [(nm, f"u-{nm}")], cls=cls))
    mpod("small-a","gpu-0-mig-1g10gb-19-0"); mpod("small-b","gpu-0-mig-1g10gb-19-1"); mpod("mid-a","gpu-0-mig-3g40gb-9-4")
    mpod("whole-a","gpu-1","gpu.nvidia.com")
    items+=[rs("small"), rs("mid"), rs("whole")]
    out(items, "# One node with 2 A100 published as partitionable devices (NVIDIA DynamicMIG layout:\n# a sharedCounters slice and one device slice per GPU, generation 2; a stale generation-1\n# slice). gpu-0 carries MIG partitions 1g.10gb ×2 and 3g.40gb; gpu-1 is held whole.\n# Generated by hack/dra-fixtures.py in the format of\n# `kubectl get nodes,pods,replicasets,resourceslices,resourceclaims,deviceclasses -A -o yaml`.")
elif which=="named":
    items=[node(f"dra-{i}") for i in range(2)]
    items+=[slice_(f"dra-{i}", [gpu_dev(g, f"dra-{i}") for g in range(8)], name=f"dra-{i}-s") for i in range(2)]
    items+=classes()
    # dra-0: a named claim shared by two pods (one GPU), a named claim of one pod, a template pod.
    items.append(pod("ml","shared-a","dra-0","u-sa",named="team-gpu"))
    items.append(pod("ml","shared-b","dra-0","u-sb",named="team-gpu"))
    items[-1]["status"]["resourceClaimStatuses"]=[]
    items.append(claim("ml","team-gpu",[{"pool":"dra-0","device":"gpu-0"}],[("shared-a","u-sa"),("shared-b","u-sb")]))
    items.append(pod("ml","solo-a","dra-0","u-so",named="solo-gpu"))
    items.append(claim("ml","solo-gpu",[{"pool":"dra-0","device":"gpu-1"}],[("solo-a","u-so")]))
    items.append(pod("ml","tpl-a","dra-0","u-t",template="one-gpu",claim_status="tpl-a-gpu-q7"))
    items.append(claim("ml","tpl-a-gpu-q7",[{"pool":"dra-0","device":"gpu-2"}],[("tpl-a","u-t")]))
    # dra-1: 6 GPUs of one workload.
    for g in range(6):
        nm=f"fill-{g}"; cn=f"fill-{g}-gpu-z{g}"
        items.append(pod("ml",nm,"dra-1",f"u-f{g}",template="one-gpu",claim_status=cn))
        items.append(claim("ml",cn,[{"pool":"dra-1","device":f"gpu-{g}"}],[(nm,f"u-f{g}")]))
    items+=[rs("shared"),rs("solo"),rs("tpl"),rs("fill")]
    out(items, "# Two nodes × 8 GPUs in ResourceSlices. On dra-0: a named claim shared by two pods, a\n# named claim of one pod, a template-claim pod; dra-1 holds six template-claim pods.\n# Generated by hack/dra-fixtures.py in the format of\n# `kubectl get nodes,pods,replicasets,resourceslices,resourceclaims,deviceclasses -A -o yaml`.")
