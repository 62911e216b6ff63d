TITLE AMPA receptor, 7-state Markov scheme of Jonas, Major & Sakmann (1993)

COMMENT
Test fixture for kingen's NMODL import, written for kingen as such synapse files usually
are. Scheme and rate constants: Jonas P, Major G, Sakmann B (1993) Quantal components of
unitary EPSCs at the mossy fibre synapse on CA3 pyramidal cells of rat hippocampus,
J Physiol 472:615-663 (the values of the public NEURON file AMPA_markov_syn.mod).
Three closed states C0-C2, open O, desensitized C3 (one glutamate), C4 (two), C5 (from O).
ENDCOMMENT

NEURON {
    POINT_PROCESS AMPA_markov
    RANGE Glu, g, gmax, nchan
    RANGE k01, k10, k12, k21, k2o, ko2, k13, k31, k24, k42, ko5, k5o, k34, k43, k45, k54
    RANGE erev
    NONSPECIFIC_CURRENT i
}

UNITS {
    (nA) = (nanoamp)
    (mV) = (millivolt)
    (pS) = (picosiemens)
    (mM) = (milli/liter)
}

PARAMETER {
    erev = 0       (mV)
    gchan = 10     (pS)          : single-channel conductance
    nchan = 100    (1)           : channels in the patch
    Glu = 0        (mM)          : glutamate concentration, set by the user
    k01 = 4.59     (/mM /ms)
    k10 = 4.26     (/ms)
    k12 = 28.4     (/mM /ms)
    k21 = 3.26     (/ms)
    k2o = 4.24     (/ms)
    ko2 = 0.90     (/ms)
    k13 = 2.89     (/ms)
    k31 = 0.0392   (/ms)
    k24 = 0.172    (/ms)
    k42 = 0.000727 (/ms)
    ko5 = 0.0177   (/ms)
    k5o = 0.004    (/ms)
    k34 = 1.27     (/mM /ms)
    k43 = 0.0457   (/ms)
    k45 = 0.0168   (/ms)
    k54 = 0.1904   (/ms)
}

ASSIGNED {
    v (mV)
    i (nA)
    g (pS)
}

STATE { C0 C1 C2 O C3 C4 C5 }

INITIAL {
    C0 = 1
}

BREAKPOINT {
    SOLVE kin METHOD sparse
    g = nchan * gchan * O
    i = (1e-6) * g * (v - erev)
}

KINETIC kin {
    ~ C0 <-> C1 (k01*Glu, k10)
    ~ C1 <-> C2 (k12*Glu, k21)
    ~ C2 <-> O  (k2o, ko2)
    ~ C1 <-> C3 (k13, k31)
    ~ C2 <-> C4 (k24, k42)
    ~ O  <-> C5 (ko5, k5o)
    ~ C3 <-> C4 (k34*Glu, k43)
    ~ C4 <-> C5 (k45, k54)
    CONSERVE C0 + C1 + C2 + O + C3 + C4 + C5 = 1
}
